"""The decoder-only causal LM every Llama-like family shares, built from the core layers.

A model plugin subclasses :class:`DecoderForCausalLM` and states, in ``decoder_spec``, only how
its family departs from the Llama layout (a :class:`DecoderSpec`: biases, q/k norm, activation,
Gemma's ``1 + w`` norms and sandwich norms, embedding scale, softmax scale, per-layer sliding
windows and rope tables, soft caps). The skeleton here holds the rest: the fused qkv projection
and its split, rope, paged attention, the gated MLP, the decoder layer loop with the residual
stream carried beside the hidden states, the final norm and the tied or untied LM head.

Module paths are HF's (``model.layers.{i}.self_attn.o_proj``, ``model.layers.{i}.mlp.up_proj``,
``model.norm``, ``lm_head``), except that q/k/v are fused into ``self_attn.qkv_proj`` (a
:class:`QKVLinear` that loads each of HF's three shards). So checkpoint names, GGUF's mapping
onto them, quantization methods' per-module choices and the tensor-parallel split (done by the
linear layers and the vocab embedding) are the same for every family, and every projection is a
core linear layer, the seam where per-token adapters hook in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from kvserve.forward_context import ForwardContext
from kvserve.interfaces.linear_kernel import LinearKernel
from kvserve.interfaces.quantization import QuantizationMethod
from kvserve.layers.activation import gated_activation
from kvserve.layers.attention import PagedAttention
from kvserve.layers.embedding import VocabEmbedding
from kvserve.layers.linear import ColumnLinear, QKVLinear, RowLinear
from kvserve.layers.loading import load_checkpoint
from kvserve.layers.norm import RMSNorm
from kvserve.layers.rotary import RotaryEmbedding


@dataclass(frozen=True)
class DecoderSpec:
    """How one family's decoder departs from the Llama layout (the defaults are Llama's).

    The sizes (hidden, intermediate, heads, KV heads, head_dim, layers, vocabulary, norm epsilon,
    maximum position) come from the HF config's standard fields; these are the differences.
    """

    activation: str = "silu"
    """The gated MLP's activation: ``"silu"`` (SwiGLU) or ``"gelu_tanh"`` (GeGLU, Gemma)."""
    qkv_bias: bool = False
    """Whether the q/k/v projections carry a bias."""
    o_bias: bool = False
    """Whether the attention output projection carries a bias."""
    mlp_bias: bool = False
    """Whether the MLP's three projections carry a bias."""
    qk_norm: bool = False
    """RMSNorm over each head's query and key vectors before rope (Qwen3, Gemma 3)."""
    norm_offset: float = 0.0
    """Every RMSNorm's ``weight_offset``: 1.0 where the checkpoint stores ``gain - 1`` (Gemma)."""
    sandwich_norms: bool = False
    """Gemma's four norms per layer: ``post_attention_layernorm`` normalizes the attention output
    before it joins the residual, ``pre_feedforward_layernorm`` is the MLP's pre-norm and
    ``post_feedforward_layernorm`` normalizes the MLP output. Without them (Llama)
    ``post_attention_layernorm`` is the MLP's pre-norm."""
    embedding_scale: float | None = None
    """Factor on the token embeddings, rounded to the model dtype first as HF does (Gemma: the
    square root of the hidden size); None: none."""
    attention_scale: float | None = None
    """The softmax scale; None: ``head_dim ** -0.5``."""
    attention_soft_cap: float | None = None
    """Soft cap of the attention scores (Gemma 2); None: none."""
    final_logit_soft_cap: float | None = None
    """Soft cap of the vocabulary logits, ``tanh(logits / cap) * cap`` (Gemma 2); None: none."""
    sliding_windows: tuple[int | None, ...] | None = None
    """Per layer, its sliding window (None: that layer attends to the whole sequence); None: no
    layer slides."""
    rope_layer_types: tuple[str, ...] | None = None
    """Per layer, the entry of the config's per-layer-type rope parameters it uses (Gemma 3's local
    and global bases; one table per type, shared); None: one rope table for every layer."""


def head_dim_of(hf_config: Any) -> int:
    """The config's ``head_dim`` when set, else ``hidden_size / num_attention_heads``."""
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads


class DecoderAttention(torch.nn.Module):
    """Fused qkv projection and its split into heads, optional per-head q/k norm, rope, paged
    attention (its window, scale and soft cap per the spec) and the output projection."""

    def __init__(
        self,
        hf_config: Any,
        spec: DecoderSpec,
        layer_idx: int,
        rotary_emb: RotaryEmbedding,
        quant_method: QuantizationMethod,
        prefix: str,
    ) -> None:
        super().__init__()
        self.head_dim = head_dim_of(hf_config)
        hidden = hf_config.hidden_size
        self.qkv_proj = QKVLinear(
            hidden, hf_config.num_attention_heads, hf_config.num_key_value_heads, self.head_dim, spec.qkv_bias,
            quant_method, f"{prefix}.qkv_proj", [f"{prefix}.{shard}" for shard in ("q_proj", "k_proj", "v_proj")],
        )  # fmt: skip
        # This tensor-parallel rank's heads (all of them on one device).
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.split_sizes = self.qkv_proj.output_sizes
        q_size = hf_config.num_attention_heads * self.head_dim
        self.o_proj = RowLinear(q_size, hidden, spec.o_bias, quant_method, f"{prefix}.o_proj")
        if spec.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, hf_config.rms_norm_eps, spec.norm_offset)
            self.k_norm = RMSNorm(self.head_dim, hf_config.rms_norm_eps, spec.norm_offset)
        else:
            self.q_norm = self.k_norm = None
        self.rotary_emb = rotary_emb
        scale = self.head_dim**-0.5 if spec.attention_scale is None else spec.attention_scale
        window = None if spec.sliding_windows is None else spec.sliding_windows[layer_idx]
        self.attn = PagedAttention(
            self.num_heads, self.num_kv_heads, self.head_dim, scale, layer_idx, window, spec.attention_soft_cap
        )

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """Attention output ``[T, hidden]`` of the normed hidden states ``[T, hidden]``."""
        q, k, v = self.qkv_proj(hidden).split(self.split_sizes, dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v, ctx))


class GatedMLP(torch.nn.Module):
    """Gated feed-forward ``down(act(gate(x)) * up(x))`` (SwiGLU, GeGLU)."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        bias: bool,
        activation: str,
        quant_method: QuantizationMethod,
        prefix: str,
    ) -> None:
        super().__init__()
        # gate and up stay separate layers: as one matmul their weight outgrew the CPU's L2 cache and
        # ran slower than two (measured ~2x on SmolLM2's 576x3072 at batch 32 with oneDNN); a
        # platform kernel that streams both fuses them through gated_kernel instead.
        self.gate_proj = ColumnLinear(hidden_size, intermediate_size, bias, quant_method, f"{prefix}.gate_proj")
        self.up_proj = ColumnLinear(hidden_size, intermediate_size, bias, quant_method, f"{prefix}.up_proj")
        self.down_proj = RowLinear(intermediate_size, hidden_size, bias, quant_method, f"{prefix}.down_proj")
        self.activation = activation
        self.act = gated_activation(activation)
        self.gated_kernel: LinearKernel | None = None
        """Set by :func:`~kvserve.layers.pack_linear_weights` where the platform's kernel runs gate, up and
        the activation as one call (:meth:`LinearKernel.apply_gated`); steps with LoRA on either
        projection keep the separate path, which adds the adapters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """MLP output ``[T, hidden]`` of the normed hidden states ``[T, hidden]``."""
        gate, up = self.gate_proj, self.up_proj
        if self.gated_kernel is not None and gate.lora is None and up.lora is None:
            return self.down_proj(self.gated_kernel.apply_gated(x, gate.weight, up.weight, self.activation))
        return self.down_proj(self.act(gate(x), up(x)))


class DecoderLayer(torch.nn.Module):
    """Pre-norm residual block: attention, then the MLP; with the spec's ``sandwich_norms`` each
    block's output is normed again before it joins the residual (``self_attn`` is built by the
    caller).

    The residual stream travels beside the hidden states, vLLM's way: each pre-norm adds the
    previous block's output to it (one fused op where the platform has one).
    """

    def __init__(
        self,
        hf_config: Any,
        spec: DecoderSpec,
        self_attn: DecoderAttention,
        quant_method: QuantizationMethod,
        prefix: str,
    ) -> None:
        super().__init__()
        hidden, eps, offset = hf_config.hidden_size, hf_config.rms_norm_eps, spec.norm_offset
        self.sandwich_norms = spec.sandwich_norms
        self.input_layernorm = RMSNorm(hidden, eps, offset)
        self.self_attn = self_attn
        self.post_attention_layernorm = RMSNorm(hidden, eps, offset)
        if self.sandwich_norms:
            self.pre_feedforward_layernorm = RMSNorm(hidden, eps, offset)
        self.mlp = GatedMLP(
            hidden, hf_config.intermediate_size, spec.mlp_bias, spec.activation, quant_method, f"{prefix}.mlp"
        )
        if self.sandwich_norms:
            self.post_feedforward_layernorm = RMSNorm(hidden, eps, offset)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None, ctx: ForwardContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mlp output, residual)``; ``residual`` is None for the first layer (``hidden`` is the
        embedding), else the stream the previous layer returned beside its output."""
        hidden, residual = self.input_layernorm.add_and_norm(hidden, residual)
        hidden = self.self_attn(positions, hidden, ctx)
        if not self.sandwich_norms:
            hidden, residual = self.post_attention_layernorm(hidden, residual)
            return self.mlp(hidden), residual
        hidden, residual = self.pre_feedforward_layernorm(self.post_attention_layernorm(hidden), residual)
        return self.post_feedforward_layernorm(self.mlp(hidden)), residual


class DecoderModel(torch.nn.Module):
    """Token embedding (scaled where the spec says), the decoder layers and the final norm (HF's
    ``model.*`` submodule)."""

    def __init__(
        self, hf_config: Any, spec: DecoderSpec, layers: list[DecoderLayer], quant_method: QuantizationMethod
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(
            hf_config.vocab_size, hf_config.hidden_size, quant_method, "model.embed_tokens"
        )
        # Made in the default (model) dtype, so rounded to it as HF's is (Gemma's sqrt(640) is
        # 25.25 in bfloat16, not 25.30).
        scale = None if spec.embedding_scale is None else torch.tensor(spec.embedding_scale)
        self.register_buffer("embed_scale", scale, persistent=False)
        self.layers = torch.nn.ModuleList(layers)
        self.norm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps, spec.norm_offset)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """Final-normed hidden states ``[T, hidden]`` of the flattened tokens of one step."""
        hidden, residual = self.embed_tokens(input_ids), None
        if self.embed_scale is not None:
            hidden = hidden * self.embed_scale.to(hidden.dtype)
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, ctx)
        return self.norm(hidden, residual)[0]


class DecoderForCausalLM(torch.nn.Module):
    """A decoder-only causal LM (the :class:`~kvserve.interfaces.Model` interface): the decoder and
    its LM head, tied to the token embedding when the config's ``tie_word_embeddings`` says so.

    Subclasses (one per HF architecture) define :meth:`decoder_spec`; nothing else is required.
    """

    supports_tensor_parallel: ClassVar[bool] = True
    """Built from the tensor-parallel core layers (the embedding and LM head vocab-parallel)."""

    def __init__(self, hf_config: Any, quant_method: QuantizationMethod) -> None:
        super().__init__()
        spec = self.decoder_spec(hf_config)
        num_layers = hf_config.num_hidden_layers
        for field in ("sliding_windows", "rope_layer_types"):
            per_layer = getattr(spec, field)
            if per_layer is not None and len(per_layer) != num_layers:
                raise ValueError(
                    f"{type(self).__name__}: DecoderSpec.{field} has {len(per_layer)} entries for the "
                    f"config's num_hidden_layers={num_layers}"
                )
        self.hf_config = hf_config
        self.spec = spec
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        rotary_embs = self._rotary_embeddings(hf_config, spec)
        layers = [
            DecoderLayer(
                hf_config,
                spec,
                DecoderAttention(hf_config, spec, i, rotary_embs[i], quant_method, f"model.layers.{i}.self_attn"),
                quant_method,
                f"model.layers.{i}",
            )
            for i in range(num_layers)
        ]
        self.model = DecoderModel(hf_config, spec, layers, quant_method)
        if self.tie_word_embeddings:
            self.lm_head = self.model.embed_tokens
        else:
            self.lm_head = VocabEmbedding(hf_config.vocab_size, hf_config.hidden_size, quant_method, "lm_head")

    @classmethod
    def decoder_spec(cls, hf_config: Any) -> DecoderSpec:
        """How this architecture departs from the Llama layout, for ``hf_config``. Raises
        ValueError naming a config field whose value the architecture does not support."""
        raise NotImplementedError(f"{cls.__name__} must define decoder_spec(hf_config)")

    @staticmethod
    def _rotary_embeddings(hf_config: Any, spec: DecoderSpec) -> list[RotaryEmbedding]:
        """Each layer's rope table: one per layer type the spec names, else one for all layers."""
        head_dim, max_position = head_dim_of(hf_config), hf_config.max_position_embeddings
        if spec.rope_layer_types is None:
            return [RotaryEmbedding(hf_config, head_dim, max_position)] * hf_config.num_hidden_layers
        tables = {
            layer_type: RotaryEmbedding(hf_config, head_dim, max_position, layer_type)
            for layer_type in sorted(set(spec.rope_layer_types))
        }
        return [tables[layer_type] for layer_type in spec.rope_layer_types]

    def attention_shape(self) -> tuple[int, int, int, int]:
        """``(num_layers, num_heads, num_kv_heads, head_dim)`` of the KV cache this model needs
        (this tensor-parallel rank's heads)."""
        attn = self.model.layers[0].self_attn
        return self.hf_config.num_hidden_layers, attn.num_heads, attn.num_kv_heads, attn.head_dim

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """Hidden states ``[num_tokens, hidden]`` for the flattened tokens of one step."""
        return self.model(input_ids, positions, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 vocabulary logits ``[n, vocab]`` for hidden rows ``[n, hidden]``, soft-capped when
        the spec says so (on rank 0 under tensor parallelism; other ranks get their vocabulary
        shard's, which are discarded)."""
        logits = self.lm_head.logits(hidden).float()
        cap = self.spec.final_logit_soft_cap
        return logits if cap is None else torch.tanh(logits / cap) * cap

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
