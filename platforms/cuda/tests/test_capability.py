"""Dtypes, features and the default dtype follow the compute capability (no GPU needed)."""

import pytest

from kvserve_platform_cuda import capability as sm


@pytest.mark.parametrize(
    ("major", "minor", "dtypes", "features", "default"),
    [
        (7, 0, ("float16", "float32"), set(), "float16"),  # V100
        (7, 5, ("float16", "float32"), set(), "float16"),  # T4
        (8, 0, ("bfloat16", "float16", "float32"), {"bf16", "tf32"}, "bfloat16"),  # A100
        (8, 6, ("bfloat16", "float16", "float32"), {"bf16", "tf32"}, "bfloat16"),  # A10
        (8, 9, ("bfloat16", "float16", "float32"), {"bf16", "tf32", "fp8"}, "bfloat16"),  # L4
        (9, 0, ("bfloat16", "float16", "float32"), {"bf16", "tf32", "fp8"}, "bfloat16"),  # H100/H200
    ],
)
def test_capability_decides_dtypes(major, minor, dtypes, features, default):
    assert sm.supported_dtypes(major, minor) == dtypes
    assert sm.features(major, minor) == features
    chosen, reason = sm.default_dtype(major, minor)
    assert chosen == default and chosen in dtypes
    assert f"sm_{major}{minor}" in reason


def test_default_dtype_reason_says_why_not_bfloat16():
    assert sm.default_dtype(7, 5) == ("float16", "sm_75 has no bfloat16 tensor cores (sm_80+)")
