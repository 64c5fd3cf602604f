"""What the engine and every tensor-parallel rank derive alike from the config and the checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvserve.components import resolve_dtype
from kvserve.config import AUTO, EngineConfig
from kvserve.errors import ConfigError
from kvserve.interfaces import Platform, QuantizationMethod
from kvserve.layers import UnquantizedLinearMethod
from kvserve.plugins import get_plugin_manager, load_component


@dataclass(frozen=True)
class ModelSettings:
    quant_method: QuantizationMethod
    dtype: torch.dtype
    """The dtype the model's weights and activations are built in."""
    max_model_len: int
    """The longest sequence (prompt and output) a request may reach."""

    @classmethod
    def resolve(cls, config: EngineConfig, platform: Platform, hf_config: Any) -> ModelSettings:
        """The settings for ``hf_config`` on ``platform``; a ConfigError names a field that cannot be met."""
        quant_method = _quant_method(config, hf_config)
        dtype = resolve_dtype(config, platform, quant_method)
        return cls(quant_method, dtype, _max_model_len(config, hf_config))


def _max_model_len(config: EngineConfig, hf_config: Any) -> int:
    limit = getattr(hf_config, "max_position_embeddings", None)
    wanted = config.model.max_model_len or limit
    if wanted is None:
        raise ConfigError("max_model_len: the model config has no max_position_embeddings; set max_model_len")
    if limit is not None and wanted > limit:
        raise ConfigError(f"max_model_len: {wanted} exceeds the model's max_position_embeddings ({limit})")
    scheduler = config.scheduler
    if not scheduler.enable_chunked_prefill and scheduler.max_num_batched_tokens < wanted:
        raise ConfigError(
            f"max_num_batched_tokens: {scheduler.max_num_batched_tokens} is below max_model_len={wanted}, "
            "so a long prompt could never be scheduled without chunked prefill"
        )
    return wanted


def _quant_method(config: EngineConfig, hf_config: Any) -> QuantizationMethod:
    choice = config.quantization.quantization
    checkpoint = getattr(hf_config, "quantization_config", None)
    if choice == AUTO:
        if not checkpoint:
            return UnquantizedLinearMethod()
        choice = checkpoint["quant_method"] if isinstance(checkpoint, dict) else checkpoint.quant_method
        # A checkpoint that also loads dequantized (a GGUF) does so where its method is not installed.
        if isinstance(checkpoint, dict) and checkpoint.get("dequantizable", False):
            if choice not in get_plugin_manager().registry("quantization_method").names():
                return UnquantizedLinearMethod()
    if choice == "none":
        return UnquantizedLinearMethod()
    if checkpoint is not None and not isinstance(checkpoint, dict):
        checkpoint = checkpoint.to_dict()
    return load_component("quantization_method", choice)(checkpoint)
