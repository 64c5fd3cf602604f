"""Resolve every ``auto`` plugin choice of an EngineConfig once, when the engine is built."""

from __future__ import annotations

from typing import Any

import torch

from kvserve.config import AUTO, EngineConfig
from kvserve.errors import ConfigError
from kvserve.interfaces import AttentionBackend, AttentionSpec, Platform, QuantizationMethod
from kvserve.plugins import get_plugin_manager, load_component


def _by_priority(kind: str, choice: str) -> str:
    """The configured name, or under ``auto`` the highest-priority registered one."""
    if choice != AUTO:
        return choice
    names = get_plugin_manager().registry(kind).names()
    return names[0] if names else AUTO  # AUTO with nothing registered: loading names what to install


def resolve_platform(config: EngineConfig) -> Platform:
    choice = config.platform.platform
    registry = get_plugin_manager().registry("platform")
    candidates = registry.names() if choice == AUTO else [choice]
    reasons = []
    for name in candidates or [choice]:
        cls = load_component("platform", name)
        reason = cls.unavailable_reason()
        if reason is None:
            return cls()
        reasons.append(f"{name}: {reason}")
    raise ConfigError(f"platform: no usable platform ({'; '.join(reasons)})")


def resolve_dtype(config: EngineConfig, platform: Platform, quant_method: QuantizationMethod) -> torch.dtype:
    """The model dtype: configured, or (``auto``) the platform's default when the quantization
    method runs it, else the first platform dtype it runs. Refusals are ConfigErrors with reasons."""
    name = config.model.dtype
    if name == AUTO:
        accepted = [d for d in platform.supported_dtypes if d in quant_method.activation_dtypes]
        name = platform.default_dtype if platform.default_dtype in accepted or not accepted else accepted[0]
    if name not in platform.supported_dtypes:
        raise ConfigError(
            f"dtype: {name} is not supported on platform {platform.name!r} "
            f"(supported: {', '.join(platform.supported_dtypes)})"
        )
    dtype = getattr(torch, name)
    reasons = quant_method.unsupported_reasons(platform, dtype)
    if reasons:
        raise ConfigError(
            f"quantization: {quant_method.name!r} cannot run on platform {platform.name!r} with dtype {name}: "
            + "; ".join(reasons)
        )
    return dtype


def resolve_attention(
    config: EngineConfig, platform: Platform, shape: tuple[int, int, int], dtype: torch.dtype
) -> tuple[type[AttentionBackend], AttentionSpec]:
    """The backend (configured, or the platform's first preference that accepts the model) and its spec."""
    num_heads, num_kv_heads, head_dim = shape
    choice = config.attention.attention_backend
    if choice == AUTO:
        registered = get_plugin_manager().registry("attention_backend").names()
        preferred = [n for n in platform.preferred_attention_backends if n in registered]
        candidates = preferred + [n for n in registered if n not in preferred]
    else:
        candidates = [choice]
    refusals = []
    for name in candidates or [choice]:
        cls = load_component("attention_backend", name)
        block_size = cls.default_block_size if config.cache.block_size == AUTO else config.cache.block_size
        spec = AttentionSpec(num_heads, num_kv_heads, head_dim, dtype, block_size, platform.device())
        reasons = cls.unsupported_reasons(spec, platform)
        if not reasons:
            return cls, spec
        refusals.append(f"{name}: {'; '.join(reasons)}")
    field = "attention_backend" if choice != AUTO else "attention_backend=auto"
    raise ConfigError(f"{field}: no attention backend can run this model ({' | '.join(refusals)})")


def resolve_policy_components(config: EngineConfig) -> tuple[Any, Any]:
    """The scheduler and KV cache manager classes (configured or highest priority)."""
    scheduler = load_component("scheduler", _by_priority("scheduler", config.scheduler.scheduler))
    manager = load_component("kv_cache_manager", _by_priority("kv_cache_manager", config.cache.kv_cache_manager))
    return scheduler, manager
