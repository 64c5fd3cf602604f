"""The declarative refusals of the AttentionBackend base: KV dtype, optional library, device architecture."""

import torch

from kvserve.interfaces import AttentionSpec, DeviceCapability, LayerAttentionSpec
from kvserve.optional_library import OptionalLibrary
from kvserve.testing.attention_reference import ReferenceAttentionBackend
from kvserve_platform_cpu.platform import CpuPlatform


class VersionedPlatform(CpuPlatform):
    """The CPU platform, reporting a versioned architecture 7.5 as a Turing GPU would."""

    def capability(self) -> DeviceCapability:
        return DeviceCapability(name="old device", major=7, minor=5)


class PickyBackend(ReferenceAttentionBackend):
    kv_cache_in_model_dtype = True
    required_library = OptionalLibrary("kvserve-no-such-dist", "nosuch", (1, 0), (2, 0), "pip install nosuch")

    @classmethod
    def required_capability(cls, spec):
        return (8, 0) if spec.dtype == torch.bfloat16 else (7, 5)


def spec(**changes) -> AttentionSpec:
    fields = dict(
        num_heads=4, num_kv_heads=2, head_dim=16, dtype=torch.float32, block_size=16, device=torch.device("cpu"),
        layers=(LayerAttentionSpec(0.25),),
    )  # fmt: skip
    return AttentionSpec(**(fields | changes))


def test_the_base_refuses_a_foreign_kv_dtype_a_missing_library_and_an_old_device():
    reasons = PickyBackend.unsupported_reasons(
        spec(dtype=torch.bfloat16, kv_cache_dtype=torch.float8_e4m3fn), VersionedPlatform()
    )
    assert reasons == [
        "KV cache dtype float8_e4m3fn not supported (this backend keeps K/V in the model dtype)",
        "nosuch is not installed (pip install nosuch)",
        "needs a device of compute capability 8.0 or newer for bfloat16; old device is 7.5",
    ]


def test_a_new_enough_or_unversioned_device_is_not_refused():
    assert PickyBackend.unsupported_reasons(spec(), VersionedPlatform()) == [
        "nosuch is not installed (pip install nosuch)"
    ]
    assert PickyBackend.unsupported_reasons(spec(dtype=torch.bfloat16), CpuPlatform()) == [
        "nosuch is not installed (pip install nosuch)"
    ]


def test_backends_that_declare_nothing_keep_the_old_checks():
    assert ReferenceAttentionBackend.unsupported_reasons(spec(kv_cache_dtype=torch.float16), VersionedPlatform()) == []
