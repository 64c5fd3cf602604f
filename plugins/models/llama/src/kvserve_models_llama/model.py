"""Llama-family decoder models (Llama, Mistral, Qwen2, Qwen3) on kvserve's paged KV cache.

The four share one implementation; they differ only in attention biases, Qwen3's
per-head q/k RMSNorm and which layers use the config's sliding window (each layer's
window goes to the attention backend through its PagedAttention). Parameter names
mirror HF's, except that q/k/v are fused into ``qkv_proj`` (one matmul) and filled
shard by shard.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from kvserve.forward_context import ForwardContext
from kvserve.interfaces import QuantizationMethod
from kvserve.layers import PagedAttention, QuantLinear, RMSNorm, RotaryEmbedding

# (checkpoint projection, fused layer holding it); the projection name is also its shard id.
STACKED_PROJECTIONS = (
    ("q_proj", "qkv_proj"),
    ("k_proj", "qkv_proj"),
    ("v_proj", "qkv_proj"),
)


class StackedLinear(QuantLinear):
    """Several checkpoint projections of the same input stacked along the output dimension.

    Each shard is a row range of every parameter, as for dense weights (a quantization method
    whose packing moves the output dimension off dim 0 would need its own shard loader).
    """

    def __init__(self, in_features: int, shard_sizes: dict[str, int], bias: bool, quant_method: QuantizationMethod):
        super().__init__(in_features, sum(shard_sizes.values()), bias, quant_method)
        self.shard_rows: dict[str, tuple[int, int]] = {}
        """Shard id -> (first output row, number of rows)."""
        start = 0
        for shard, size in shard_sizes.items():
            self.shard_rows[shard] = (start, size)
            start += size

    def load_shard(self, param_name: str, shard: str, tensor: torch.Tensor) -> None:
        """Copy the checkpoint tensor of ``shard`` into its rows of parameter ``param_name``."""
        start, size = self.shard_rows[shard]
        rows = getattr(self, param_name).data.narrow(0, start, size)
        if tensor.shape != rows.shape:
            raise ValueError(f"{shard}.{param_name}: expected shape {tuple(rows.shape)}, got {tuple(tensor.shape)}")
        rows.copy_(tensor)


class VocabEmbedding(torch.nn.Module):
    """A ``[vocab, hidden]`` matrix used as token embedding and/or as the LM head."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        # Left uninitialised: load_weights fills it, and random init of a large vocab is slow.
        self.weight = torch.nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Embedding rows of ``input_ids``."""
        return F.embedding(input_ids, self.weight)


class LlamaAttention(torch.nn.Module):
    """Fused qkv projection, optional per-head q/k norm, rope, paged attention, output projection."""

    def __init__(
        self,
        hf_config: Any,
        layer_idx: int,
        rotary_emb: RotaryEmbedding,
        quant_method: QuantizationMethod,
        qkv_bias: bool,
        o_bias: bool,
        qk_norm: bool,
    ) -> None:
        super().__init__()
        self.num_heads = hf_config.num_attention_heads
        self.num_kv_heads = hf_config.num_key_value_heads
        self.head_dim = head_dim_of(hf_config)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.split_sizes = [q_size, kv_size, kv_size]
        hidden = hf_config.hidden_size
        shards = {"q_proj": q_size, "k_proj": kv_size, "v_proj": kv_size}
        self.qkv_proj = StackedLinear(hidden, shards, qkv_bias, quant_method)
        self.o_proj = QuantLinear(q_size, hidden, o_bias, quant_method)
        if qk_norm:  # Qwen3: RMSNorm over each head's vector, before rope
            self.q_norm = RMSNorm(self.head_dim, hf_config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, hf_config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.rotary_emb = rotary_emb
        scale = self.head_dim**-0.5
        window = sliding_window_of(hf_config, layer_idx)
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, self.head_dim, scale, layer_idx, window)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split(self.split_sizes, dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v, ctx))


class LlamaMLP(torch.nn.Module):
    """SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))`` with gate and up fused."""

    def __init__(self, hf_config: Any, quant_method: QuantizationMethod) -> None:
        super().__init__()
        if hf_config.hidden_act != "silu":
            raise ValueError(f"hidden_act {hf_config.hidden_act!r} is not supported (only 'silu')")
        hidden, intermediate = hf_config.hidden_size, hf_config.intermediate_size
        bias = getattr(hf_config, "mlp_bias", False)
        # gate and up stay separate: fused, their weight outgrows the CPU's L2 cache and the
        # single matmul runs slower than two (measured ~2x on SmolLM2's 576x3072 at batch 32).
        self.gate_proj = QuantLinear(hidden, intermediate, bias, quant_method)
        self.up_proj = QuantLinear(hidden, intermediate, bias, quant_method)
        self.down_proj = QuantLinear(intermediate, hidden, bias, quant_method)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(torch.nn.Module):
    """Pre-norm residual block: attention, then MLP (``self_attn`` is built by the caller)."""

    def __init__(self, hf_config: Any, self_attn: LlamaAttention, quant_method: QuantizationMethod) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps)
        self.self_attn = self_attn
        self.post_attention_layernorm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps)
        self.mlp = LlamaMLP(hf_config, quant_method)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        hidden = hidden + self.self_attn(positions, self.input_layernorm(hidden), ctx)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class LlamaModel(torch.nn.Module):
    """Token embedding, the decoder layers and the final norm (HF's ``model.*`` submodule)."""

    def __init__(self, hf_config: Any, layers: list[LlamaDecoderLayer]) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(hf_config.vocab_size, hf_config.hidden_size)
        self.layers = torch.nn.ModuleList(layers)
        self.norm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden = layer(positions, hidden, ctx)
        return self.norm(hidden)


class LlamaForCausalLM(torch.nn.Module):
    """Llama (and the base of the other families): biases from ``attention_bias`` / ``mlp_bias``."""

    qk_norm: ClassVar[bool] = False
    """Qwen3's per-head RMSNorm of q and k."""

    def __init__(self, hf_config: Any, quant_method: QuantizationMethod) -> None:
        super().__init__()
        self.hf_config = hf_config
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        head_dim = head_dim_of(hf_config)
        # One rope table shared by every layer.
        rotary_emb = RotaryEmbedding(hf_config, head_dim, hf_config.max_position_embeddings)
        qkv_bias, o_bias = self.attention_biases(hf_config)
        layers = [
            LlamaDecoderLayer(
                hf_config,
                LlamaAttention(hf_config, i, rotary_emb, quant_method, qkv_bias, o_bias, self.qk_norm),
                quant_method,
            )
            for i in range(hf_config.num_hidden_layers)
        ]
        self.model = LlamaModel(hf_config, layers)
        if self.tie_word_embeddings:
            self.lm_head = self.model.embed_tokens
        else:
            self.lm_head = VocabEmbedding(hf_config.vocab_size, hf_config.hidden_size)

    @staticmethod
    def attention_biases(hf_config: Any) -> tuple[bool, bool]:
        """Whether q/k/v and o_proj carry a bias."""
        bias = bool(getattr(hf_config, "attention_bias", False))
        return bias, bias

    def attention_shape(self) -> tuple[int, int, int, int]:
        """``(num_layers, num_heads, num_kv_heads, head_dim)`` of the KV cache this model needs."""
        config = self.hf_config
        return (
            config.num_hidden_layers,
            config.num_attention_heads,
            config.num_key_value_heads,
            head_dim_of(config),
        )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """Hidden states ``[num_tokens, hidden]`` for the flattened tokens of one step."""
        return self.model(input_ids, positions, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 vocabulary logits for hidden rows ``[n, hidden]``."""
        return F.linear(hidden, self.lm_head.weight).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors into the parameters, casting to their dtype and device.

        q/k/v and gate/up tensors land in their rows of the fused layers. A tied checkpoint's
        ``lm_head.weight`` (a copy of the embedding) and rope ``inv_freq`` buffers are skipped.
        Raises KeyError for a tensor with no place in the model or a parameter left unloaded.
        """
        params = dict(self.named_parameters())
        modules = dict(self.named_modules())
        unloaded = self._checkpoint_names()
        for name, tensor in weights:
            if name.endswith("rotary_emb.inv_freq") or (self.tie_word_embeddings and name == "lm_head.weight"):
                continue
            if name not in unloaded:
                raise KeyError(f"checkpoint tensor {name!r} has no place in {type(self).__name__}")
            unloaded.remove(name)
            module_name, _, param_name = name.rpartition(".")
            parent, _, projection = module_name.rpartition(".")
            fused = dict(STACKED_PROJECTIONS).get(projection)
            if fused is not None:
                modules[f"{parent}.{fused}"].load_shard(param_name, projection, tensor)
                continue
            param = params[name]
            if tensor.shape != param.shape:
                raise ValueError(f"{name}: expected shape {tuple(param.shape)}, got {tuple(tensor.shape)}")
            param.data.copy_(tensor)
        if unloaded:
            raise KeyError(f"checkpoint lacks {len(unloaded)} tensors, e.g. {sorted(unloaded)[:5]}")

    def _checkpoint_names(self) -> set[str]:
        """The HF tensor names a checkpoint must provide: fused parameters expand to their shards."""
        names = set()
        for name, _ in self.named_parameters():
            module_name, _, param_name = name.rpartition(".")
            parent, _, layer = module_name.rpartition(".")
            shards = [projection for projection, fused in STACKED_PROJECTIONS if fused == layer]
            if shards:
                names.update(f"{parent}.{shard}.{param_name}" for shard in shards)
            else:
                names.add(name)
        return names


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral: the Llama architecture; ``sliding_window`` (when set) applies to every layer."""


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2: q/k/v always carry a bias, o_proj never; with ``use_sliding_window``, layers from
    ``max_window_layers`` on are sliding (as the config's ``layer_types`` says)."""

    @staticmethod
    def attention_biases(hf_config: Any) -> tuple[bool, bool]:
        return True, False


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3: per-head RMSNorm of q and k before rope; biases from ``attention_bias``."""

    qk_norm = True


def head_dim_of(hf_config: Any) -> int:
    """The config's ``head_dim`` when set, else ``hidden_size / num_attention_heads``."""
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads


def sliding_window_of(hf_config: Any, layer_idx: int) -> int | None:
    """The sliding window of layer ``layer_idx``, as transformers applies it; None: full attention.

    The config's ``layer_types`` decides per layer when present (transformers derives it for
    Qwen2/Qwen3 from ``use_sliding_window`` and ``max_window_layers``: layers ``>= max_window_layers``
    slide); otherwise ``sliding_window`` applies to every layer (Mistral), unless
    ``use_sliding_window`` is false. A window no sequence can exceed is dropped.
    """
    window = getattr(hf_config, "sliding_window", None)
    if window is None or window >= hf_config.max_position_embeddings:
        return None
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types is not None:
        return window if layer_types[layer_idx] == "sliding_attention" else None
    if not getattr(hf_config, "use_sliding_window", True):
        return None
    return window if layer_idx >= getattr(hf_config, "max_window_layers", 0) else None
