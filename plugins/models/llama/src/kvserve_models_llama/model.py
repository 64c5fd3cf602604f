"""Llama-family decoder models (Llama, Mistral, Qwen2, Qwen3) on kvserve's paged KV cache.

The four share one implementation; they differ only in attention biases, Qwen3's
per-head q/k RMSNorm and which layers use the config's sliding window (each layer's
window goes to the attention backend through its PagedAttention). Parameter names
mirror HF's, except that q/k/v are fused into ``qkv_proj`` (one matmul, a
``MergedColumnLinear`` that loads each shard).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch

from kvserve.forward_context import ForwardContext
from kvserve.interfaces import QuantizationMethod
from kvserve.layers import (
    ColumnLinear,
    PagedAttention,
    QKVLinear,
    RMSNorm,
    RotaryEmbedding,
    RowLinear,
    SiluAndMul,
    VocabEmbedding,
    load_checkpoint,
)


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
        prefix: str,
    ) -> None:
        super().__init__()
        self.head_dim = head_dim_of(hf_config)
        hidden = hf_config.hidden_size
        self.qkv_proj = QKVLinear(
            hidden, hf_config.num_attention_heads, hf_config.num_key_value_heads, self.head_dim, qkv_bias,
            quant_method, f"{prefix}.qkv_proj", [f"{prefix}.{shard}" for shard in ("q_proj", "k_proj", "v_proj")],
        )  # fmt: skip
        # This tensor-parallel rank's heads (all of them on one device).
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.split_sizes = self.qkv_proj.output_sizes
        q_size = hf_config.num_attention_heads * self.head_dim
        self.o_proj = RowLinear(q_size, hidden, o_bias, quant_method, f"{prefix}.o_proj")
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
    """SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))``, gate and up two projections."""

    def __init__(self, hf_config: Any, quant_method: QuantizationMethod, prefix: str) -> None:
        super().__init__()
        if hf_config.hidden_act != "silu":
            raise ValueError(f"hidden_act {hf_config.hidden_act!r} is not supported (only 'silu')")
        hidden, intermediate = hf_config.hidden_size, hf_config.intermediate_size
        bias = getattr(hf_config, "mlp_bias", False)
        # gate and up stay separate: fused, their weight outgrows the CPU's L2 cache and the
        # single matmul runs slower than two (measured ~2x on SmolLM2's 576x3072 at batch 32).
        self.gate_proj = ColumnLinear(hidden, intermediate, bias, quant_method, f"{prefix}.gate_proj")
        self.up_proj = ColumnLinear(hidden, intermediate, bias, quant_method, f"{prefix}.up_proj")
        self.down_proj = RowLinear(intermediate, hidden, bias, quant_method, f"{prefix}.down_proj")
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x), self.up_proj(x)))


class LlamaDecoderLayer(torch.nn.Module):
    """Pre-norm residual block: attention, then MLP (``self_attn`` is built by the caller).

    The residual stream travels beside the hidden states, vLLM's way: each norm adds the previous
    block's output to it (one fused op where the platform has one).
    """

    def __init__(
        self, hf_config: Any, self_attn: LlamaAttention, quant_method: QuantizationMethod, prefix: str
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps)
        self.self_attn = self_attn
        self.post_attention_layernorm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps)
        self.mlp = LlamaMLP(hf_config, quant_method, f"{prefix}.mlp")

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None, ctx: ForwardContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mlp output, residual)``; ``residual`` is None for the first layer (``hidden`` is the
        embedding), else the stream the previous layer returned beside its output."""
        hidden, residual = self.input_layernorm.add_and_norm(hidden, residual)
        hidden = self.self_attn(positions, hidden, ctx)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(torch.nn.Module):
    """Token embedding, the decoder layers and the final norm (HF's ``model.*`` submodule)."""

    def __init__(self, hf_config: Any, layers: list[LlamaDecoderLayer]) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(hf_config.vocab_size, hf_config.hidden_size)
        self.layers = torch.nn.ModuleList(layers)
        self.norm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, ctx)
        return self.norm(hidden, residual)[0]


class LlamaForCausalLM(torch.nn.Module):
    """Llama (and the base of the other families): biases from ``attention_bias`` / ``mlp_bias``."""

    qk_norm: ClassVar[bool] = False
    """Qwen3's per-head RMSNorm of q and k."""
    supports_tensor_parallel: ClassVar[bool] = True
    """Built from the tensor-parallel core layers (the embedding and LM head vocab-parallel)."""

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
                LlamaAttention(
                    hf_config,
                    i,
                    rotary_emb,
                    quant_method,
                    qkv_bias,
                    o_bias,
                    self.qk_norm,
                    f"model.layers.{i}.self_attn",
                ),
                quant_method,
                f"model.layers.{i}",
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
        """``(num_layers, num_heads, num_kv_heads, head_dim)`` of the KV cache this model needs
        (this tensor-parallel rank's heads)."""
        attn = self.model.layers[0].self_attn
        return self.hf_config.num_hidden_layers, attn.num_heads, attn.num_kv_heads, attn.head_dim

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """Hidden states ``[num_tokens, hidden]`` for the flattened tokens of one step."""
        return self.model(input_ids, positions, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 vocabulary logits ``[n, vocab]`` for hidden rows ``[n, hidden]`` (on rank 0 under
        tensor parallelism; other ranks get their vocabulary shard's, which are discarded)."""
        return self.lm_head.logits(hidden).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors into the parameters, casting to their dtype and device.

        q/k/v land in their shards of the fused ``qkv_proj`` (the linear layers say where). A tied
        checkpoint's ``lm_head.weight`` (a copy of the embedding) and rope ``inv_freq`` buffers are
        skipped. Raises ``kvserve.errors.WeightLoadError`` naming a tensor with no place in the
        model, or the tensors the checkpoint lacks.
        """

        def skip(name: str) -> bool:
            return name.endswith("rotary_emb.inv_freq") or (self.tie_word_embeddings and name == "lm_head.weight")

        load_checkpoint(self, weights, skip=skip)


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
