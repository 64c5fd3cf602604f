"""What a CUDA compute capability (sm_XY) runs natively: dtypes, feature names, the default dtype."""

from __future__ import annotations

BF16_SINCE = (8, 0)
"""Ampere (sm_80) brought bfloat16 (and TF32) tensor cores."""
FP8_SINCE = (8, 9)
"""Ada (sm_89) and Hopper (sm_90) have FP8 tensor cores."""


def supported_dtypes(major: int, minor: int) -> tuple[str, ...]:
    """Model/KV dtypes a device of this capability runs: float16 and float32 always, bfloat16 on sm80+."""
    if (major, minor) >= BF16_SINCE:
        return ("bfloat16", "float16", "float32")
    return ("float16", "float32")


def features(major: int, minor: int) -> frozenset[str]:
    """Feature names for :class:`~kvserve.interfaces.DeviceCapability`: ``bf16``, ``tf32``, ``fp8``."""
    names = set()
    if (major, minor) >= BF16_SINCE:
        names |= {"bf16", "tf32"}
    if (major, minor) >= FP8_SINCE:
        names.add("fp8")
    return frozenset(names)


def default_dtype(major: int, minor: int) -> tuple[str, str]:
    """The ``dtype="auto"`` choice and why: bfloat16 where native (float16's range overflows in some
    checkpoints trained in bf16), else float16 (float32 would waste the tensor cores)."""
    if (major, minor) >= BF16_SINCE:
        return "bfloat16", f"sm_{major}{minor} runs bfloat16 natively"
    return "float16", f"sm_{major}{minor} has no bfloat16 tensor cores (sm_80+)"
