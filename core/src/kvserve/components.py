"""Resolve every ``auto`` plugin choice of an EngineConfig once, when the engine is built."""

from __future__ import annotations

from typing import Any

import torch

from kvserve.config import AUTO, EngineConfig
from kvserve.errors import ConfigError, PluginError
from kvserve.interfaces import AttentionBackend, AttentionSpec, LayerAttentionSpec, Platform, QuantizationMethod
from kvserve.plugins import get_plugin_manager, load_component


def _by_priority(kind: str, choice: str) -> str:
    """The configured name, or under ``auto`` the highest-priority registered one."""
    if choice != AUTO:
        return choice
    names = get_plugin_manager().registry(kind).names()
    return names[0] if names else AUTO  # AUTO with nothing registered: loading names what to install


def resolve_platform(config: EngineConfig) -> Platform:
    """The configured platform, or under ``auto`` the highest-priority one that can run here and
    that an installed attention backend runs on (a GPU with no GPU attention backend installed
    falls back to the CPU rather than failing)."""
    choice = config.platform.platform
    registry = get_plugin_manager().registry("platform")
    candidates = registry.names() if choice == AUTO else [choice]
    reasons = []
    for name in candidates or [choice]:
        cls = load_component("platform", name)
        reason = cls.unavailable_reason()
        if reason is None and choice == AUTO:
            reason = unserved_reason(cls)
        if reason is None:
            return cls()
        reasons.append(f"{name}: {reason}")
    raise ConfigError(f"platform: no usable platform ({'; '.join(reasons)})")


def unserved_reason(platform: type[Platform]) -> str | None:
    """Why no installed attention backend runs on ``platform``'s device type (None: one does, or
    none is installed at all, which attention resolution reports with what to install)."""
    registry = get_plugin_manager().registry("attention_backend")
    names = registry.names()
    for name in names:
        try:
            if platform.device_type in load_component("attention_backend", name).device_types:
                return None
        except PluginError:  # a broken backend serves nothing; selecting it reports why
            continue
    return f"no installed attention backend runs on {platform.device_type!r} devices" if names else None


def resolve_dtype(config: EngineConfig, platform: Platform, quant_method: QuantizationMethod) -> torch.dtype:
    """The model dtype: configured, or (``auto``) the platform's default when the quantization
    method runs it, else the first platform dtype it runs. Refusals are ConfigErrors with reasons."""
    name = config.model.dtype
    if name == AUTO:
        default = platform.default_dtype()
        accepted = [d for d in platform.supported_dtypes if d in quant_method.activation_dtypes]
        name = default if default in accepted or not accepted else accepted[0]
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


def dtype_reason(config: EngineConfig, platform: Platform) -> str:
    """Why the engine runs in its dtype, for the start-up line."""
    return "configured" if config.model.dtype != AUTO else f"auto: {platform.default_dtype_reason()}"


def resolve_attention(
    config: EngineConfig,
    platform: Platform,
    shape: tuple[int, int, int],
    layers: tuple[LayerAttentionSpec, ...],
    dtype: torch.dtype,
) -> tuple[type[AttentionBackend], AttentionSpec]:
    """The backend (configured, or the platform's first preference that accepts the model) and its spec.

    ``shape`` is ``(num_heads, num_kv_heads, head_dim)``, ``layers`` the model's per-layer facts.
    """
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
        if choice == AUTO and platform.device_type not in cls.device_types:
            # a backend that can be forced onto this device for tests (Triton's interpreter) is never chosen for it
            refusals.append(f"{name}: runs on {', '.join(cls.device_types)}, not {platform.device_type}")
            continue
        block_size = cls.default_block_size if config.cache.block_size == AUTO else config.cache.block_size
        spec = AttentionSpec(num_heads, num_kv_heads, head_dim, dtype, block_size, platform.device(), layers)
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
