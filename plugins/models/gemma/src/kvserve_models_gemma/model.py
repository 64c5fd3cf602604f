"""Gemma 3 (text) and Gemma 2 decoder models on kvserve's paged KV cache.

Both are core's decoder skeleton (:class:`kvserve.layers.DecoderForCausalLM`) with Gemma's
peculiarities stated in its :class:`~kvserve.layers.DecoderSpec`: local (sliding-window) and
global attention layers interleaved as the config's ``layer_types`` says, embeddings scaled by
``sqrt(hidden)`` (rounded to the model dtype, as HF does), RMSNorm gains stored as ``gain - 1``,
a norm after attention and after the MLP besides the usual pre-norms, a GELU-tanh gated MLP and
a softmax scale of ``query_pre_attn_scalar ** -0.5``. Gemma 3 adds per-head q/k RMSNorm and a
rope base per layer type (``rope_parameters["sliding_attention"]`` / ``["full_attention"]``);
Gemma 2 soft-caps attention scores and final logits instead. Parameter names mirror HF's,
except that q/k/v are fused into ``qkv_proj``. Tensor-parallel like the Llama family.
"""

from __future__ import annotations

from typing import Any, ClassVar

from kvserve.layers import DecoderForCausalLM, DecoderSpec
from kvserve.layers.rotary import rope_parameters

GEMMA_NORM_OFFSET = 1.0
"""Gemma's RMSNorm multiplies by ``1 + weight``."""
SLIDING = "sliding_attention"


class Gemma3ForCausalLM(DecoderForCausalLM):
    """Gemma 3, text only: q/k norms and one rope table per layer type (local and global bases)."""

    qk_norm: ClassVar[bool] = True

    @classmethod
    def decoder_spec(cls, hf_config: Any) -> DecoderSpec:
        if getattr(hf_config, "use_bidirectional_attention", False):
            raise ValueError("use_bidirectional_attention=True (EmbeddingGemma) is not supported: kvserve is causal")
        if hf_config.hidden_activation != "gelu_pytorch_tanh":
            raise ValueError(
                f"hidden_activation {hf_config.hidden_activation!r} is not supported (only 'gelu_pytorch_tanh')"
            )
        layer_types = tuple(hf_config.layer_types)
        bias = bool(hf_config.attention_bias)
        return DecoderSpec(
            activation="gelu_tanh",
            qkv_bias=bias,
            o_bias=bias,
            qk_norm=cls.qk_norm,
            norm_offset=GEMMA_NORM_OFFSET,
            sandwich_norms=True,
            embedding_scale=hf_config.hidden_size**0.5,
            attention_scale=hf_config.query_pre_attn_scalar**-0.5,
            attention_soft_cap=hf_config.attn_logit_softcapping,
            final_logit_soft_cap=getattr(hf_config, "final_logit_softcapping", None),
            sliding_windows=tuple(hf_config.sliding_window if t == SLIDING else None for t in layer_types),
            # One rope table per layer type where the config gives rope parameters per type, else
            # one shared by all layers (Gemma 2).
            rope_layer_types=layer_types if set(layer_types) <= set(rope_parameters(hf_config)) else None,
        )


class Gemma2ForCausalLM(Gemma3ForCausalLM):
    """Gemma 2: no q/k norms, one rope base; attention scores and final logits soft-capped."""

    qk_norm = False
