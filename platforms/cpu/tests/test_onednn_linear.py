"""The CPU platform's oneDNN linear kernel: the same products as ``F.linear`` on prepacked weights,
and no packing where it cannot run."""

import pytest
import torch
import torch.nn.functional as F

from kvserve_platform_cpu import native_linear
from kvserve_platform_cpu.native_linear import NativeLinearKernel, native_linear_kernel
from kvserve_platform_cpu.onednn_linear import OneDnnLinearKernel, onednn_linear_kernel
from kvserve_platform_cpu.platform import CpuPlatform

kernel = onednn_linear_kernel()
pytestmark = pytest.mark.skipif(kernel is None, reason="this torch build has no oneDNN (mkldnn)")

# (rows of x, out features, in features): decode batches, a prefill, odd sizes.
SHAPES = [(1, 1280, 768), (7, 96, 64), (32, 4096, 768), (257, 768, 2048), (3, 50, 33)]


@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_float32_products_match_f_linear(m, n, k, bias):
    gen = torch.Generator().manual_seed(m * n + k)
    weight, x = torch.randn(n, k, generator=gen), torch.randn(m, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    packed = kernel.pack(weight.clone())
    assert packed is not None and packed.shape == weight.shape and packed.dtype == torch.float32
    # Summation order differs from MKL's: rounding grows with the k terms summed.
    torch.testing.assert_close(kernel.apply(x, packed, b), F.linear(x, weight, b), rtol=1e-5, atol=1e-6 * k)


@pytest.mark.skipif(
    kernel is None or torch.bfloat16 not in kernel.dtypes, reason="oneDNN has no native bfloat16 on this CPU"
)
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_bfloat16_products_match_f_linear(m, n, k):
    gen = torch.Generator().manual_seed(n + k)
    weight, x = torch.randn(n, k, generator=gen).bfloat16(), torch.randn(m, k, generator=gen).bfloat16()
    out = kernel.apply(x, kernel.pack(weight), None)
    assert out.dtype == torch.bfloat16
    # F.linear runs bfloat16 through oneDNN too: only the weight's layout differs.
    torch.testing.assert_close(out, F.linear(x, weight))


def test_leading_dimensions_and_strided_rows_are_kept():
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(40, 24, generator=gen)
    x = torch.randn(2, 5, 48, generator=gen)[..., :24]  # not contiguous
    out = kernel.apply(x, kernel.pack(weight), None)
    assert out.shape == (2, 5, 40) and out.is_contiguous()
    torch.testing.assert_close(out, F.linear(x, weight), rtol=1e-5, atol=1e-5)


def test_packed_weight_owns_its_memory():
    weight = torch.randn(64, 32)
    packed = kernel.pack(weight)
    expected = F.linear(torch.ones(1, 32), weight)
    weight.zero_()
    torch.testing.assert_close(kernel.apply(torch.ones(1, 32), packed, None), expected)


@pytest.mark.parametrize(
    "weight",
    [
        torch.randn(8, 8, dtype=torch.float16),  # not measured faster: stays on F.linear
        torch.randn(8, 8, dtype=torch.float64),
        torch.empty(8, 8, device="meta"),  # not on the CPU
        torch.randn(8),  # not a matrix
    ],
    ids=["float16", "float64", "meta", "vector"],
)
def test_weights_it_does_not_run_stay_dense(weight):
    assert kernel.pack(weight) is None


def test_bfloat16_is_packed_only_with_native_support():
    assert OneDnnLinearKernel(frozenset({torch.float32})).pack(torch.randn(4, 4).bfloat16()) is None
    assert (torch.bfloat16 in kernel.dtypes) == torch.ops.mkldnn._is_mkldnn_bf16_supported()


def test_the_platform_offers_it_as_the_native_kernels_fallback():
    offered = CpuPlatform().linear_kernel()
    if native_linear_kernel(None) is None:  # the native kernel cannot be built or runs no dtype here
        assert isinstance(offered, OneDnnLinearKernel) and offered.dtypes == kernel.dtypes
    else:
        assert isinstance(offered, NativeLinearKernel) and offered.name.startswith(torch.ops.kvserve_cpu_linear.isa())
        assert isinstance(offered.fallback, OneDnnLinearKernel) and offered.fallback.dtypes == kernel.dtypes


def test_the_platform_offers_it_alone_without_the_native_kernel(monkeypatch):
    monkeypatch.setattr(native_linear, "unavailable_reason", lambda name, sources: "no C++ compiler (test)")
    offered = CpuPlatform().linear_kernel()
    assert isinstance(offered, OneDnnLinearKernel) and offered.name == "onednn" and offered.dtypes == kernel.dtypes
