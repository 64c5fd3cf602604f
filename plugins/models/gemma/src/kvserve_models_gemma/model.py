"""Gemma 3 (text) and Gemma 2 decoder models on kvserve's paged KV cache.

Both interleave local (sliding-window) and global attention layers as the config's
``layer_types`` says, and share Gemma's peculiarities: embeddings scaled by ``sqrt(hidden)``
(rounded to the model dtype, as HF does), RMSNorm gains stored as ``gain - 1``, a norm after
attention and after the MLP besides the usual pre-norms, a GELU-tanh gated MLP and a softmax
scale of ``query_pre_attn_scalar ** -0.5``. Gemma 3 adds per-head q/k RMSNorm and a rope base
per layer type (``rope_parameters["sliding_attention"]`` / ``["full_attention"]``); Gemma 2
soft-caps attention scores and final logits instead. Parameter names mirror HF's, except that
q/k/v are fused into ``qkv_proj`` (a ``QKVLinear`` that loads each shard). Tensor-parallel
like the Llama family: heads and MLP features split over ranks by the core layers, the
embedding and (tied) LM head vocab-parallel.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from kvserve.forward_context import ForwardContext
from kvserve.interfaces import QuantizationMethod
from kvserve.layers import (
    ColumnLinear,
    PagedAttention,
    QKVLinear,
    RMSNorm,
    RotaryEmbedding,
    RowLinear,
    VocabEmbedding,
    load_checkpoint,
)
from kvserve.layers.rotary import rope_parameters

GEMMA_NORM_OFFSET = 1.0
"""Gemma's RMSNorm multiplies by ``1 + weight``."""
SLIDING = "sliding_attention"


class GemmaAttention(torch.nn.Module):
    """Fused qkv projection, optional per-head q/k norm, rope, paged attention, output projection."""

    def __init__(
        self,
        hf_config: Any,
        layer_idx: int,
        rotary_emb: RotaryEmbedding,
        quant_method: QuantizationMethod,
        qk_norm: bool,
        prefix: str,
    ) -> None:
        super().__init__()
        self.head_dim = hf_config.head_dim
        hidden = hf_config.hidden_size
        bias = bool(hf_config.attention_bias)
        self.qkv_proj = QKVLinear(
            hidden, hf_config.num_attention_heads, hf_config.num_key_value_heads, self.head_dim, bias,
            quant_method, f"{prefix}.qkv_proj", [f"{prefix}.{shard}" for shard in ("q_proj", "k_proj", "v_proj")],
        )  # fmt: skip
        # This tensor-parallel rank's heads (all of them on one device).
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.split_sizes = self.qkv_proj.output_sizes
        q_size = hf_config.num_attention_heads * self.head_dim
        self.o_proj = RowLinear(q_size, hidden, bias, quant_method, f"{prefix}.o_proj")
        if qk_norm:
            self.q_norm = RMSNorm(self.head_dim, hf_config.rms_norm_eps, GEMMA_NORM_OFFSET)
            self.k_norm = RMSNorm(self.head_dim, hf_config.rms_norm_eps, GEMMA_NORM_OFFSET)
        else:
            self.q_norm = self.k_norm = None
        self.rotary_emb = rotary_emb
        sliding = hf_config.layer_types[layer_idx] == SLIDING
        self.attn = PagedAttention(
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            hf_config.query_pre_attn_scalar**-0.5,
            layer_idx,
            sliding_window=hf_config.sliding_window if sliding else None,
            logits_soft_cap=hf_config.attn_logit_softcapping,
        )

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split(self.split_sizes, dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v, ctx))


class GemmaMLP(torch.nn.Module):
    """Gated feed-forward: ``down(gelu_tanh(gate(x)) * up(x))``."""

    def __init__(self, hf_config: Any, quant_method: QuantizationMethod, prefix: str) -> None:
        super().__init__()
        if hf_config.hidden_activation != "gelu_pytorch_tanh":
            raise ValueError(
                f"hidden_activation {hf_config.hidden_activation!r} is not supported (only 'gelu_pytorch_tanh')"
            )
        hidden, intermediate = hf_config.hidden_size, hf_config.intermediate_size
        self.gate_proj = ColumnLinear(hidden, intermediate, False, quant_method, f"{prefix}.gate_proj")
        self.up_proj = ColumnLinear(hidden, intermediate, False, quant_method, f"{prefix}.up_proj")
        self.down_proj = RowLinear(intermediate, hidden, False, quant_method, f"{prefix}.down_proj")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class GemmaDecoderLayer(torch.nn.Module):
    """Attention and MLP, each between a pre-norm and a post-norm, each added to the residual.

    The residual stream travels beside the hidden states, vLLM's way: each pre-norm adds the
    previous block's post-normed output to it (one fused op where the platform has one).
    """

    def __init__(
        self, hf_config: Any, self_attn: GemmaAttention, quant_method: QuantizationMethod, prefix: str
    ) -> None:
        super().__init__()
        hidden, eps = hf_config.hidden_size, hf_config.rms_norm_eps
        self.input_layernorm = RMSNorm(hidden, eps, GEMMA_NORM_OFFSET)
        self.self_attn = self_attn
        self.post_attention_layernorm = RMSNorm(hidden, eps, GEMMA_NORM_OFFSET)
        self.pre_feedforward_layernorm = RMSNorm(hidden, eps, GEMMA_NORM_OFFSET)
        self.mlp = GemmaMLP(hf_config, quant_method, f"{prefix}.mlp")
        self.post_feedforward_layernorm = RMSNorm(hidden, eps, GEMMA_NORM_OFFSET)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None, ctx: ForwardContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(post-normed mlp output, residual)``; ``residual`` is None for the first layer (``hidden``
        is the scaled embedding), else the stream the previous layer returned beside its output."""
        hidden, residual = self.input_layernorm.add_and_norm(hidden, residual)
        hidden = self.post_attention_layernorm(self.self_attn(positions, hidden, ctx))
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        return self.post_feedforward_layernorm(self.mlp(hidden)), residual


class GemmaModel(torch.nn.Module):
    """Scaled token embedding, the decoder layers and the final norm (HF's ``model.*`` submodule)."""

    def __init__(self, hf_config: Any, layers: list[GemmaDecoderLayer]) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(hf_config.vocab_size, hf_config.hidden_size)
        # HF multiplies by sqrt(hidden) rounded to the embedding dtype (25.25 in bfloat16 for 640, not 25.30).
        self.register_buffer("embed_scale", torch.tensor(hf_config.hidden_size**0.5), persistent=False)
        self.layers = torch.nn.ModuleList(layers)
        self.norm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps, GEMMA_NORM_OFFSET)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        hidden, residual = hidden * self.embed_scale.to(hidden.dtype), None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, ctx)
        return self.norm(hidden, residual)[0]


class Gemma3ForCausalLM(torch.nn.Module):
    """Gemma 3, text only: q/k norms and one rope table per layer type (local and global bases)."""

    qk_norm: ClassVar[bool] = True
    supports_tensor_parallel: ClassVar[bool] = True
    """Built from the tensor-parallel core layers (the embedding and LM head vocab-parallel)."""

    def __init__(self, hf_config: Any, quant_method: QuantizationMethod) -> None:
        super().__init__()
        if getattr(hf_config, "use_bidirectional_attention", False):
            raise ValueError("use_bidirectional_attention=True (EmbeddingGemma) is not supported: kvserve is causal")
        self.hf_config = hf_config
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        rotary_by_type = self.rotary_embeddings(hf_config)
        layers = [
            GemmaDecoderLayer(
                hf_config,
                GemmaAttention(
                    hf_config, i, rotary_by_type[layer_type], quant_method, self.qk_norm, f"model.layers.{i}.self_attn"
                ),
                quant_method,
                f"model.layers.{i}",
            )
            for i, layer_type in enumerate(hf_config.layer_types)
        ]
        self.model = GemmaModel(hf_config, layers)
        if self.tie_word_embeddings:
            self.lm_head = self.model.embed_tokens
        else:
            self.lm_head = VocabEmbedding(hf_config.vocab_size, hf_config.hidden_size)

    @staticmethod
    def rotary_embeddings(hf_config: Any) -> dict[str, RotaryEmbedding]:
        """Layer type -> its rope table: one per type when the config gives rope parameters per type,
        else one table shared by all layers (Gemma 2)."""
        types = sorted(set(hf_config.layer_types))
        head_dim, max_position = hf_config.head_dim, hf_config.max_position_embeddings
        if set(types) <= set(rope_parameters(hf_config)):
            return {layer_type: RotaryEmbedding(hf_config, head_dim, max_position, layer_type) for layer_type in types}
        shared = RotaryEmbedding(hf_config, head_dim, max_position)
        return dict.fromkeys(types, shared)

    def attention_shape(self) -> tuple[int, int, int, int]:
        """``(num_layers, num_heads, num_kv_heads, head_dim)`` of the KV cache this model needs
        (this tensor-parallel rank's heads)."""
        attn = self.model.layers[0].self_attn
        return self.hf_config.num_hidden_layers, attn.num_heads, attn.num_kv_heads, attn.head_dim

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """Hidden states ``[num_tokens, hidden]`` for the flattened tokens of one step."""
        return self.model(input_ids, positions, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 vocabulary logits ``[n, vocab]`` for hidden rows ``[n, hidden]``, soft-capped when the
        config says so (on rank 0 under tensor parallelism; other ranks get their vocabulary
        shard's, which are discarded)."""
        logits = self.lm_head.logits(hidden).float()
        cap = getattr(self.hf_config, "final_logit_softcapping", None)
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors into the parameters (q/k/v into their shards of ``qkv_proj``); a tied
        checkpoint's ``lm_head.weight`` is skipped. Raises ``kvserve.errors.WeightLoadError`` naming a
        tensor with no place in the model, or the tensors the checkpoint lacks."""
        load_checkpoint(self, weights, skip=lambda name: self.tie_word_embeddings and name == "lm_head.weight")


class Gemma2ForCausalLM(Gemma3ForCausalLM):
    """Gemma 2: no q/k norms, one rope base; attention scores and final logits soft-capped."""

    qk_norm = False
