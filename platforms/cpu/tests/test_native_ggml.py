"""The CPU kernel's GGML blocks (``csrc/ggml.cpp``): Q8_0 and Q4_1 weights as gguf-py writes them, times
rows quantized per 32-block to int8 as llama.cpp does, on both paths (AVX-512 VNNI and the portable
loop), against a float64 reference of the same integer arithmetic and within the activation
quantization's error of the dequantized product; the path is selectable."""

import gguf
import numpy as np
import pytest
import torch

from kvserve_platform_cpu import native_linear
from kvserve_platform_cpu.native_linear import GGML_SOURCES, NativeLinearKernel, native_linear_kernel

kernel = native_linear_kernel(None)
pytestmark = pytest.mark.skipif(
    not isinstance(kernel, NativeLinearKernel) or not kernel.ggml_types,
    reason=f"no native GGML kernel here: {native_linear.unavailable_reason(native_linear.GGML_LIBRARY, GGML_SOURCES)}",
)
VNNI = isinstance(kernel, NativeLinearKernel) and bool(kernel.ggml_types) and torch.ops.kvserve_cpu_ggml.has_vnni()
PATHS = [pytest.param("vnni", marks=pytest.mark.skipif(not VNNI, reason="no AVX-512 VNNI")), "portable"]


def weight_blocks(type_name: str, n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """gguf-py's blocks of a random ``[n, k]`` weight (uint8 ``[n, row_bytes]``) and their dequantized values."""
    weight = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * k**-0.5
    qtype = gguf.GGMLQuantizationType[type_name]
    blocks = gguf.quants.quantize(weight, qtype)
    return blocks, np.asarray(gguf.quants.dequantize(blocks, qtype), dtype=np.float64)


def integer_reference(x: np.ndarray, type_name: str, blocks: np.ndarray) -> np.ndarray:
    """float64 llama.cpp arithmetic: x per 32-block to ``round(x / d)`` with ``d = max|x| / 127``, then
    each block's integer dot with the weight's quants times both scales (plus Q4_1's ``m * d * sum q``)."""
    m, k = x.shape
    xb = x.reshape(m, k // 32, 32).astype(np.float32)
    d = np.abs(xb).max(-1, keepdims=True) / np.float32(127)
    q = np.rint(np.divide(xb, d, out=np.zeros_like(xb), where=d > 0)).astype(np.int64)
    n = blocks.shape[0]
    size = 34 if type_name == "Q8_0" else 20
    b = blocks.reshape(n, k // 32, size)
    scale = b[..., :2].copy().view(np.float16)[..., 0].astype(np.float64)
    if type_name == "Q8_0":
        wq = b[..., 2:].view(np.int8).astype(np.int64)
    else:
        qs = b[..., 4:]
        wq = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int64)
    isum = np.einsum("mbi,nbi->mnb", q, wq).astype(np.float64)
    out = (isum * scale[None] * d[..., 0][:, None, :].astype(np.float64)).sum(-1)
    if type_name == "Q4_1":
        mins = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
        out += (mins[None] * (d[..., 0] * q.sum(-1))[:, None, :]).sum(-1)
    return out


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_1"])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 48, 576), (3, 17, 64), (8, 96, 1536)])
def test_products_match_the_integer_reference(path, type_name, m, n, k):
    blocks, dense = weight_blocks(type_name, n, k, seed=n + k)
    x = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
    x[0, :32] = 0  # a zero block (scale 0)
    got = torch.ops.kvserve_cpu_ggml.ggml_linear(
        torch.from_numpy(x), torch.from_numpy(blocks.reshape(-1)), native_linear.GGML_TYPE_IDS[type_name], n,
        path == "vnni",
    ).double().numpy()  # fmt: skip
    np.testing.assert_allclose(got, integer_reference(x, type_name, blocks), rtol=1e-4, atol=1e-4)
    exact = x.astype(np.float64) @ dense.T
    error = np.linalg.norm(got - exact) / np.linalg.norm(exact)
    assert error < 0.02, f"the int8 activations move the product by {error:.3g} (relative)"


def test_the_path_is_selectable():
    """VNNI by default where the build has it; ``ggml_path = "portable"`` runs the portable loop."""
    fresh = NativeLinearKernel(kernel.dtypes, None)
    assert fresh.ggml_types and fresh.ggml_path == ("vnni" if VNNI else "portable")
    blocks, _ = weight_blocks("Q8_0", 16, 64, seed=7)
    x = torch.randn(1, 64, generator=torch.Generator().manual_seed(8))
    data = torch.from_numpy(blocks.reshape(-1))
    fresh.ggml_path = "portable"
    portable = torch.ops.kvserve_cpu_ggml.ggml_linear(x, data, 8, 16, False)
    assert torch.equal(fresh.apply_ggml(x, data, "Q8_0", 16), portable)


def test_apply_ggml_quantizes_activations_of_any_float_dtype():
    blocks, dense = weight_blocks("Q4_1", 32, 256, seed=5)
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(6)).bfloat16()
    y = kernel.apply_ggml(x, torch.from_numpy(blocks.reshape(-1)), "Q4_1", 32)
    assert y.dtype == torch.float32 and y.shape == (2, 32)
    exact = x.double().numpy() @ dense.T
    assert np.linalg.norm(y.double().numpy() - exact) / np.linalg.norm(exact) < 0.02
