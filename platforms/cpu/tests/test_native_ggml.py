"""The CPU kernel's GGML blocks (``csrc/ggml.cpp``), on both paths of each op (AVX-512 and the portable loop):

- ``ggml_linear``, single rows: Q8_0 and Q4_1 weights as gguf-py writes them times rows quantized per
  32-block to int8 as llama.cpp does, against a float64 reference of the same integer arithmetic and
  within the activation quantization's error of the dequantized product;
- ``ggml_tiled_linear``, any rows: every type's blocks dequantized to bfloat16 equal gguf-py's own
  dequantization rounded to bfloat16 block for block, and the products equal a float64 product of
  those weights and the bfloat16 rows up to float32 summation; for float32 rows, the blocks dequantized
  to float32 equal gguf-py's exactly, and the products equal the float64 product of those weights and
  the rows up to float32 summation.

``apply_ggml`` (one ``ggml_layer`` op a layer) picks between them per part by dtype, rows and type, puts a
fused layer's parts side by side, and the path is selectable."""

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
BUILT = isinstance(kernel, NativeLinearKernel) and bool(kernel.ggml_types)
VNNI = BUILT and torch.ops.kvserve_cpu_ggml.has_vnni()
BF16 = BUILT and torch.ops.kvserve_cpu_ggml.has_bf16()
AVX512 = BUILT and torch.ops.kvserve_cpu_ggml.has_avx512()
DOT_PATHS = [pytest.param("vnni", marks=pytest.mark.skipif(not VNNI, reason="no AVX-512 VNNI")), "portable"]
TILE_PATHS = [pytest.param("bf16", marks=pytest.mark.skipif(not BF16, reason="no AVX512-BF16")), "portable"]
DOT_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
F32_TILE_PATHS = [pytest.param("avx512", marks=pytest.mark.skipif(not AVX512, reason="no AVX-512")), "portable"]
TILE_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]


def weight_blocks(type_name: str, n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """gguf-py's blocks of a random ``[n, k]`` weight (uint8 ``[n, row_bytes]``) and their dequantized values."""
    weight = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * k**-0.5
    qtype = gguf.GGMLQuantizationType[type_name]
    blocks = gguf.quants.quantize(weight, qtype)
    return blocks, np.asarray(gguf.quants.dequantize(blocks, qtype), dtype=np.float64)


def random_blocks(type_name: str, n: int, k: int, seed: int) -> np.ndarray:
    """Random bytes as ``[n, k]`` weights' blocks (every quant bit pattern is valid), the float16 scale
    fields set to small finite values (gguf-py writes no K-quants, so this covers every type alike)."""
    qtype = gguf.GGMLQuantizationType[type_name]
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    count = n * k // block_size
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(count, type_size), dtype=np.uint8)
    fields = {"Q6_K": [208], "Q4_1": [0, 2], "Q5_1": [0, 2], "Q4_K": [0, 2], "Q5_K": [0, 2]}.get(type_name, [0])
    for offset in fields:
        blocks[:, offset : offset + 2] = (rng.standard_normal((count, 1)) * 0.01).astype(np.float16).view(np.uint8)
    return blocks.reshape(n, -1)


def integer_reference(x: np.ndarray, type_name: str, blocks: np.ndarray) -> np.ndarray:
    """float64 llama.cpp arithmetic: x per 32-block to ``round(x / d)`` with ``d = max|x| / 127``, then each
    block's dot of those integers with the weight's values as gguf-py dequantizes them, times ``d``."""
    m, k = x.shape
    xb = x.reshape(m, k // 32, 32).astype(np.float32)
    d = np.abs(xb).max(-1, keepdims=True) / np.float32(127)
    q = np.rint(np.divide(xb, d, out=np.zeros_like(xb), where=d > 0)).astype(np.float64)
    weights = np.asarray(gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[type_name]), dtype=np.float64)
    per_block = np.einsum("mbi,nbi->mnb", q, weights.reshape(blocks.shape[0], k // 32, 32))
    return (per_block * d[..., 0][:, None, :].astype(np.float64)).sum(-1)


@pytest.mark.parametrize("path", DOT_PATHS)
@pytest.mark.parametrize("type_name", DOT_TYPES)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 48, 576), (3, 17, 64), (2, 9, 96), (8, 96, 1536)])
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


@pytest.mark.parametrize("path", DOT_PATHS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_rows_are_quantized_as_their_float32_values(path, dtype):
    """A bfloat16/float16 row gives the float32 row's sums (the same int8 blocks), rounded once to its dtype."""
    blocks, _ = weight_blocks("Q4_1", 40, 576, seed=3)
    data = torch.from_numpy(blocks.reshape(-1))
    x = torch.randn(2, 576, generator=torch.Generator().manual_seed(4)).to(dtype)
    op = torch.ops.kvserve_cpu_ggml.ggml_linear
    got = op(x, data, 3, 40, path == "vnni")
    assert got.dtype == dtype
    assert torch.equal(got, op(x.float(), data, 3, 40, path == "vnni").to(dtype))


@pytest.mark.parametrize("path", DOT_PATHS)
@pytest.mark.parametrize("type_name", DOT_TYPES)
def test_every_quant_bit_pattern_matches_the_integer_reference(path, type_name):
    """Random bytes as blocks: every nibble, fifth bit and signed byte occurs (gguf-py's quantizer of a
    smooth weight leaves some rare); 4 features a step and the 1-feature remainder, an odd block count."""
    n, k = 23, 96
    blocks = random_blocks(type_name, n, k, seed=11)
    x = np.random.default_rng(12).standard_normal((1, k)).astype(np.float32)
    got = torch.ops.kvserve_cpu_ggml.ggml_linear(
        torch.from_numpy(x), torch.from_numpy(blocks.reshape(-1)), native_linear.GGML_TYPE_IDS[type_name], n,
        path == "vnni",
    ).double().numpy()  # fmt: skip
    np.testing.assert_allclose(got, integer_reference(x, type_name, blocks), rtol=1e-4, atol=1e-4)


def tiled(x: torch.Tensor, blocks: np.ndarray, type_name: str, n: int, path: str) -> np.ndarray:
    op = torch.ops.kvserve_cpu_ggml.ggml_tiled_linear
    data = torch.from_numpy(blocks.reshape(-1))
    return op(x, data, native_linear.GGML_TYPE_IDS[type_name], n, path != "portable").double().numpy()


def bf16_weights(type_name: str, blocks: np.ndarray) -> np.ndarray:
    """gguf-py's dequantization of ``blocks`` rounded to bfloat16 (what ``quantization="none"`` holds), float64."""
    values = np.asarray(gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[type_name]), dtype=np.float32)
    return torch.from_numpy(values).bfloat16().double().numpy()


@pytest.mark.parametrize("path", TILE_PATHS)
@pytest.mark.parametrize("type_name", TILE_TYPES)
def test_tiles_hold_ggufs_weights_in_bfloat16(path, type_name):
    """Rows of the identity read each tile back: every weight equals gguf-py's, rounded to bfloat16
    (a tile and a half of features, so both a full tile and a partial one)."""
    n, k = 48, 512
    blocks = random_blocks(type_name, n, k, seed=len(type_name))
    got = tiled(torch.eye(k, dtype=torch.bfloat16), blocks, type_name, n, path)
    np.testing.assert_array_equal(got.T, bf16_weights(type_name, blocks))


@pytest.mark.parametrize("path", TILE_PATHS)
@pytest.mark.parametrize("type_name", TILE_TYPES)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 7, 256), (6, 33, 512), (33, 70, 1536)])
def test_tiled_products_match_the_bfloat16_reference(path, type_name, m, n, k):
    """Rows and features that fill the 4 x 4 register blocks and leave every remainder; the products are
    exact in float32, so only the sums' rounding differs: bounded by the sum of the products' magnitudes."""
    blocks = random_blocks(type_name, n, k, seed=m + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).bfloat16().double().numpy()
    weights = bf16_weights(type_name, blocks)
    error = np.abs(tiled(torch.from_numpy(x).bfloat16(), blocks, type_name, n, path) - x @ weights.T)
    assert (error <= 1e-5 * (np.abs(x) @ np.abs(weights).T)).all(), error.max()


@pytest.mark.parametrize("path", F32_TILE_PATHS)
@pytest.mark.parametrize("type_name", TILE_TYPES)
def test_float32_tiles_hold_ggufs_weights(path, type_name):
    """float32 rows of the identity read each tile back: every weight equals gguf-py's float32 value,
    not rounded (what ``quantization="none"`` holds in float32)."""
    n, k = 48, 512
    blocks = random_blocks(type_name, n, k, seed=len(type_name))
    expected = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[type_name])
    got = tiled(torch.eye(k, dtype=torch.float32), blocks, type_name, n, path)
    np.testing.assert_array_equal(got.T, np.asarray(expected, dtype=np.float32))


@pytest.mark.parametrize("path", F32_TILE_PATHS)
@pytest.mark.parametrize("type_name", TILE_TYPES)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 7, 256), (6, 33, 512), (33, 70, 1536)])
def test_float32_tiled_products_match_the_dequantized_reference(path, type_name, m, n, k):
    """float32 rows times the float32 weights: only the order of the float32 sums differs from the
    float64 product, bounded by the sum of the products' magnitudes."""
    blocks = random_blocks(type_name, n, k, seed=m + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    weights = np.asarray(gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[type_name]), dtype=np.float64)
    error = np.abs(tiled(x, blocks, type_name, n, path) - x.double().numpy() @ weights.T)
    assert (error <= 1e-5 * (np.abs(x.double().numpy()) @ np.abs(weights).T)).all(), error.max()


@pytest.mark.parametrize(
    ("dtype", "path"), [(torch.float32, p) for p in F32_TILE_PATHS] + [(torch.bfloat16, p) for p in TILE_PATHS]
)
def test_a_rows_tiled_product_does_not_depend_on_the_other_rows(dtype, path):
    """Each row's sums run in an order fixed by k alone (row panels, k chunks, register blocks): a row
    multiplied among 70 (three row panels, a partial register block) equals it multiplied alone, bit for bit."""
    blocks = random_blocks("Q4_K", 40, 768, seed=3)
    x = torch.randn(70, 768, generator=torch.Generator().manual_seed(4)).to(dtype)
    together = tiled(x, blocks, "Q4_K", 40, path)
    for row in (0, 5, 33, 69):
        np.testing.assert_array_equal(tiled(x[row : row + 1], blocks, "Q4_K", 40, path)[0], together[row])


@pytest.mark.parametrize("path", TILE_PATHS)
def test_tiles_take_no_rows(path):
    blocks = random_blocks("Q4_1", 8, 64, seed=2)
    assert tiled(torch.empty(0, 64, dtype=torch.bfloat16), blocks, "Q4_1", 8, path).shape == (0, 8)


def test_the_path_is_selectable():
    """AVX-512 by default where the build has it; ``ggml_path = "portable"`` runs the portable loops."""
    fresh = NativeLinearKernel(kernel.dtypes, None)
    assert fresh.ggml_types == frozenset(native_linear.GGML_TYPE_IDS)
    assert fresh.ggml_path == ("avx512" if VNNI or BF16 or AVX512 else "portable")
    blocks, _ = weight_blocks("Q8_0", 16, 64, seed=7)
    data = torch.from_numpy(blocks.reshape(-1))
    fresh.ggml_path = "portable"
    ops = torch.ops.kvserve_cpu_ggml
    parts = (("Q8_0", 16),)
    x = torch.randn(1, 64, generator=torch.Generator().manual_seed(8)).bfloat16()
    assert torch.equal(fresh.apply_ggml(x, data, parts), ops.ggml_linear(x, data, 8, 16, False))
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(9)).bfloat16()
    assert torch.equal(fresh.apply_ggml(x, data, parts), ops.ggml_tiled_linear(x, data, 8, 16, False).bfloat16())
    x = x.float()
    assert torch.equal(fresh.apply_ggml(x, data, parts), ops.ggml_tiled_linear(x, data, 8, 16, False))


def test_apply_ggml_picks_integer_dots_for_few_rows_and_tiles_for_more():
    """Up to ``ggml_dot_rows`` bfloat16 rows of Q4_1 are the integer dots' product; one more, one row of
    Q4_K, or float32 rows of any count, the tiles' (float32 rows are never quantized)."""
    ops = torch.ops.kvserve_cpu_ggml
    dot_rows = ops.ggml_dot_rows()
    assert dot_rows >= 1
    blocks, _ = weight_blocks("Q4_1", 32, 256, seed=5)
    data = torch.from_numpy(blocks.reshape(-1))
    x = torch.randn(dot_rows + 1, 256, generator=torch.Generator().manual_seed(6)).bfloat16()
    parts = (("Q4_1", 32),)
    few, more = kernel.apply_ggml(x[:dot_rows], data, parts), kernel.apply_ggml(x, data, parts)
    assert torch.equal(few, ops.ggml_linear(x[:dot_rows], data, 3, 32, VNNI))
    assert torch.equal(more, ops.ggml_tiled_linear(x, data, 3, 32, BF16).bfloat16())
    k_blocks = torch.from_numpy(random_blocks("Q4_K", 32, 256, seed=1).reshape(-1))
    k_tiled = ops.ggml_tiled_linear(x[:1], k_blocks, 12, 32, BF16).bfloat16()
    assert torch.equal(kernel.apply_ggml(x[:1], k_blocks, (("Q4_K", 32),)), k_tiled)
    row = x[:1].float()
    assert torch.equal(kernel.apply_ggml(row, data, parts), ops.ggml_tiled_linear(row, data, 3, 32, AVX512))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_layers_parts_come_side_by_side_each_on_its_own_path(dtype):
    """Gemma's fused q/k/v: Q5_0 then Q8_0 parts, here with a Q4_K one too. One call gives each part's own
    product in its columns: the integer dots for one bfloat16 row of the 32-weight types, tiles for the
    K-quant and for more rows or float32 rows, each as that op alone gives it, in the rows' dtype."""
    ops = torch.ops.kvserve_cpu_ggml
    types, sizes = ["Q5_0", "Q8_0", "Q4_K"], [48, 16, 24]
    shards = [torch.from_numpy(random_blocks(t, n, 256, seed=n).reshape(-1)) for t, n in zip(types, sizes, strict=True)]
    data, parts = torch.cat(shards), tuple(zip(types, sizes, strict=True))
    for rows in (1, 5):
        x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)).to(dtype)
        y = kernel.apply_ggml(x, data, parts)
        assert y.shape == (rows, sum(sizes)) and y.dtype == dtype
        for (ggml_type, n), blocks, column in zip(parts, shards, (0, 48, 64), strict=True):
            type_id = native_linear.GGML_TYPE_IDS[ggml_type]
            if dtype == torch.bfloat16 and rows == 1 and ggml_type != "Q4_K":
                alone = ops.ggml_linear(x, blocks, type_id, n, VNNI)
            else:
                alone = ops.ggml_tiled_linear(x, blocks, type_id, n, AVX512 if dtype == torch.float32 else BF16)
            assert torch.equal(y[:, column : column + n], alone.to(dtype)), f"{ggml_type}, {rows} rows"
    with pytest.raises(RuntimeError, match="blocks must be contiguous uint8 of"):
        kernel.apply_ggml(x, data[:-1], parts)


def test_apply_ggml_takes_activations_of_any_float_dtype():
    blocks, dense = weight_blocks("Q4_1", 32, 256, seed=5)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for rows in (1, 5):
            x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(6)).to(dtype)
            y = kernel.apply_ggml(x, torch.from_numpy(blocks.reshape(-1)), (("Q4_1", 32),))
            assert y.dtype == dtype and y.shape == (rows, 32)
            exact = x.double().numpy() @ dense.T
            assert np.linalg.norm(y.double().numpy() - exact) / np.linalg.norm(exact) < 0.02
