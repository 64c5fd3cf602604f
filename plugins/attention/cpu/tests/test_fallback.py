"""Without a C++ compiler the backend keeps its PyTorch path, says so and why, and still passes the contract."""

import pytest
import torch

from kvserve.interfaces import AttentionSpec, LayerAttentionSpec
from kvserve.testing import AttentionBackendContract
from kvserve.testing.attention_reference import build_batch
from kvserve_attention_cpu import native_kernel
from kvserve_attention_cpu.backend import CpuAttentionBackend
from kvserve_attention_cpu.native_paged import NativePagedMetadata
from kvserve_attention_cpu.torch_paged import TorchPagedMetadata
from kvserve_cpu_native import cpu_name_and_flags


@pytest.fixture
def no_compiler(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")


def spec(dtype=torch.bfloat16) -> AttentionSpec:
    return AttentionSpec(9, 3, 64, dtype, 16, torch.device("cpu"), (LayerAttentionSpec(0.125),))


def test_without_a_compiler_the_pytorch_path_runs_and_kernels_says_why(no_compiler):
    backend = CpuAttentionBackend(spec())
    assert backend.kernels().startswith(
        "PyTorch fallback (cannot build kvserve_attention_cpu: no C++ compiler ('/nonexistent/c++' is not on PATH"
    )
    assert "over gathered blocks" in backend.kernels()
    metadata = backend.build_metadata(build_batch([[1, 2]], [20], [1], 16))
    assert isinstance(metadata, TorchPagedMetadata)


def test_with_the_kernel_kernels_names_it():
    reason = native_kernel.unavailable_reason()
    if reason is not None:
        pytest.skip(f"the C++ kernel cannot be built here: {reason}")
    backend = CpuAttentionBackend(spec())
    assert "C++ paged kernel" in backend.kernels() and "fallback" not in backend.kernels()
    assert isinstance(backend.build_metadata(build_batch([[1, 2]], [20], [1], 16)), NativePagedMetadata)


def test_kernels_says_the_instructions_the_kernel_was_built_for():
    reason = native_kernel.unavailable_reason()
    if reason is not None:
        pytest.skip(f"the C++ kernel cannot be built here: {reason}")
    flags = cpu_name_and_flags()[1]
    # built -march=native: AVX-512 where the CPU has it, else AVX2 with FMA, else the portable loops
    expected = "avx512" if "avx512f" in flags else "avx2" if {"avx2", "fma"} <= flags else "portable"
    assert f"C++ paged kernel ({expected})" in CpuAttentionBackend(spec()).kernels()


class TestPyTorchFallbackContract(AttentionBackendContract):
    """The whole attention contract on the fallback path (every dtype it claims)."""

    backend = "cpu"
    dtypes = ("float32", "bfloat16", "float16")

    @pytest.fixture(autouse=True)
    def _no_compiler(self, no_compiler):
        pass
