"""Which native bfloat16 matmul instructions the host CPU has (flags: :func:`kvserve_cpu_native.cpu_name_and_flags`)."""

from __future__ import annotations

BF16_FEATURES = {"amx_bf16": "AMX-BF16", "avx512_bf16": "AVX512-BF16"}
"""``/proc/cpuinfo`` flags of native bfloat16 matmul, best first, with their usual spelling."""


def native_bf16_feature(flags: frozenset[str]) -> str | None:
    """The name of the CPU's native bfloat16 matmul feature (``"AMX-BF16"``...), or None."""
    return next((label for flag, label in BF16_FEATURES.items() if flag in flags), None)
