"""What the host CPU is and which native bfloat16 matmul instructions it has."""

from __future__ import annotations

import functools
import platform as host
from pathlib import Path

import torch

BF16_FEATURES = {"amx_bf16": "AMX-BF16", "avx512_bf16": "AVX512-BF16"}
"""``/proc/cpuinfo`` flags of native bfloat16 matmul, best first, with their usual spelling."""


@functools.cache
def cpu_name_and_flags() -> tuple[str, frozenset[str]]:
    """The CPU model name and its feature flags (``/proc/cpuinfo`` on Linux; torch's probes elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return host.processor() or host.machine(), _flags_from_torch()
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    # ARM kernels say "Features", x86 "flags".
    flags = frozenset((fields.get("flags") or fields.get("Features") or "").split())
    return fields.get("model name") or host.processor() or host.machine(), flags


def _flags_from_torch() -> frozenset[str]:
    """The bf16 flags torch's own CPU probes report (macOS, Windows: no /proc/cpuinfo)."""
    probes = {"amx_bf16": torch.cpu._is_amx_tile_supported, "avx512_bf16": torch.cpu._is_avx512_bf16_supported}
    return frozenset(flag for flag, probe in probes.items() if probe())


def native_bf16_feature(flags: frozenset[str]) -> str | None:
    """The name of the CPU's native bfloat16 matmul feature (``"AMX-BF16"``...), or None."""
    return next((label for flag, label in BF16_FEATURES.items() if flag in flags), None)
