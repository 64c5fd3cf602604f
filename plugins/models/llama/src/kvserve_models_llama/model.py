"""Llama-family decoder models (Llama, Mistral, Qwen2, Qwen3) on kvserve's paged KV cache.

All four are core's decoder skeleton (:class:`kvserve.layers.DecoderForCausalLM`: fused qkv,
rope, paged attention, SwiGLU MLP, pre-norm layers, tied or untied head) in its Llama layout;
they differ only in attention biases, Qwen3's per-head q/k RMSNorm and which layers use the
config's sliding window (each layer's window goes to the attention backend through its
PagedAttention). Parameter names mirror HF's, except that q/k/v are fused into ``qkv_proj``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from kvserve.layers import DecoderForCausalLM, DecoderSpec


class LlamaForCausalLM(DecoderForCausalLM):
    """Llama (and the base of the other families): biases from ``attention_bias`` / ``mlp_bias``."""

    qk_norm: ClassVar[bool] = False
    """Qwen3's per-head RMSNorm of q and k."""

    @classmethod
    def decoder_spec(cls, hf_config: Any) -> DecoderSpec:
        if hf_config.hidden_act != "silu":
            raise ValueError(f"hidden_act {hf_config.hidden_act!r} is not supported (only 'silu')")
        qkv_bias, o_bias = cls.attention_biases(hf_config)
        return DecoderSpec(
            activation="silu",
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            mlp_bias=bool(getattr(hf_config, "mlp_bias", False)),
            qk_norm=cls.qk_norm,
            sliding_windows=tuple(sliding_window_of(hf_config, i) for i in range(hf_config.num_hidden_layers)),
        )

    @staticmethod
    def attention_biases(hf_config: Any) -> tuple[bool, bool]:
        """Whether q/k/v and o_proj carry a bias."""
        bias = bool(getattr(hf_config, "attention_bias", False))
        return bias, bias


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
