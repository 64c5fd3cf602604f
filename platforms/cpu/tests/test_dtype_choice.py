"""The CPU platform picks bfloat16 exactly where the CPU multiplies it natively, and says so."""

import pytest

from kvserve_cpu_native import cpu_name_and_flags
from kvserve_platform_cpu.cpu_info import native_bf16_feature
from kvserve_platform_cpu.platform import CpuPlatform


@pytest.mark.parametrize(
    ("flags", "feature"),
    [
        ({"avx2", "avx512f", "amx_tile", "amx_bf16", "avx512_bf16"}, "AMX-BF16"),  # Sapphire Rapids
        ({"avx2", "avx512f", "avx512_bf16"}, "AVX512-BF16"),  # Zen 4, Cooper Lake
        ({"avx2", "avx512f"}, None),  # Skylake-SP: bf16 would be emulated
        ({"asimd", "bf16"}, None),  # ARM: not among the features vLLM's CPU build uses
        (set(), None),
    ],
)
def test_native_bf16_feature(flags, feature):
    assert native_bf16_feature(frozenset(flags)) == feature


def test_this_machine_follows_its_flags():
    platform = CpuPlatform()
    feature = native_bf16_feature(platform.capability().features)
    if feature:
        assert (platform.default_dtype(), platform.default_dtype_reason()) == ("bfloat16", f"CPU has {feature}")
    else:
        assert platform.default_dtype() == "float32"
        assert "no native bfloat16" in platform.default_dtype_reason()


def test_capability_names_the_cpu():
    name, flags = cpu_name_and_flags()
    cap = CpuPlatform().capability()
    assert cap.name == name and cap.name and cap.features == flags
    assert (cap.major, cap.minor) == (None, None) and not cap.at_least(1)


def test_explicit_fraction_is_not_capped():
    platform = CpuPlatform()
    default = platform.kv_cache_memory_bytes(0, None)
    assert default <= 4 << 30
    assert platform.kv_cache_memory_bytes(0, 1.0) >= default
