"""The CPU kernel's FP8 (E4M3) weights: products within rounding of a float64 reference of the
dequantized weight at every edge of its tiling (row tiles, the staged prefill path and AMX, narrow
panels, k not a multiple of a vector), every E4M3 value (subnormals, both signs) converted exactly,
the seam's packing rules, and FP8 layers moved onto the kernel by the engine's packing step."""

import pytest
import torch
import torch.nn.functional as F

from kvserve_platform_cpu import native_linear
from kvserve_platform_cpu.native_linear import NativeLinearKernel, native_linear_kernel

kernel = native_linear_kernel(None)
unavailable = native_linear.unavailable_reason(native_linear.LIBRARY, native_linear.SOURCES)
pytestmark = pytest.mark.skipif(
    not isinstance(kernel, NativeLinearKernel) or not kernel.fp8_dtypes,
    reason=f"no native FP8 kernel here: {unavailable or 'this CPU lacks AVX-512 VBMI'}",
)

# Rows: one, a partial row tile (7), one tile (8) and a row more (9), the most converted in registers
# (16), the first staged (17; on AMX still one pass of two tile groups), 32 and 33 (on AMX the last
# step-converted count and the first whole-panel one), 64.
ROWS = [1, 7, 8, 9, 16, 17, 32, 33, 64]
# (out, in): a panel and 5 columns (37, k = 70: not a multiple of a vector), a narrow 17-column
# panel, 2 x 2, three panels over k = 300 (two staged chunks), and sizes that fill AMX tiles
# (64 x 256, 96 x 768) where the CPU has it.
SIZES = [(37, 70), (17, 130), (2, 2), (96, 300), (64, 256), (96, 768)]
CODES = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)  # every non-NaN E4M3


def fp8_weight(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """An E4M3 weight whose bytes are drawn from every value (row 0 runs through them in order)."""
    codes = CODES[torch.randint(len(CODES), (n, k), generator=gen)]
    first = CODES[torch.arange(k) % len(CODES)]
    codes[0] = first
    return codes.view(torch.float8_e4m3fn)


def reference(x, weight, scale, bias) -> torch.Tensor:
    """float64 ``x @ (weight * scale).T + bias``: the weight dequantized in torch."""
    dense = weight.double() * scale.double().reshape(-1, 1)
    return F.linear(x.double(), dense, None if bias is None else bias.double())


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize(("n", "k"), SIZES)
@pytest.mark.parametrize("per_column", [False, True], ids=["per_tensor", "per_column"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_products_match_the_dequantized_weight(m, n, k, per_column, dtype):
    if dtype not in kernel.fp8_dtypes:
        pytest.skip(f"the FP8 kernel does not run {dtype} activations here")
    gen = torch.Generator().manual_seed(m * n + k)
    weight = fp8_weight(n, k, gen)
    # Scales that bring E4M3's +-448 near +-1, as checkpoints' amax / 448 do.
    scale = (torch.rand(n, 1, generator=gen) + 0.5) / 448 if per_column else torch.tensor(1 / 448)
    x, bias = torch.randn(m, k, generator=gen).to(dtype), torch.randn(n, generator=gen).to(dtype)
    packed = kernel.pack_quantized(weight, scale, dtype)
    assert packed.shape == weight.shape and packed.dtype == torch.float8_e4m3fn
    out = kernel.apply_quantized(x, packed, scale, bias)
    assert out.shape == (m, n) and out.dtype == dtype and out.is_contiguous()
    expected = reference(x, weight, scale, bias)
    if dtype == torch.float32:  # exact weights, FMA in k order, the scale once
        torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6 * k)
    else:  # exact products, float32 sums, one rounding to bfloat16
        torch.testing.assert_close(out.double(), expected, rtol=2**-8, atol=1e-3 * max(1, k / 256))


def test_leading_dimensions_strided_rows_and_no_rows():
    gen = torch.Generator().manual_seed(1)
    weight, scale = fp8_weight(50, 34, gen), torch.tensor(0.01)
    x = torch.randn(2, 5, 48, generator=gen)[..., :34]  # not contiguous
    packed = kernel.pack_quantized(weight, scale, torch.float32)
    out = kernel.apply_quantized(x, packed, scale, None)
    assert out.shape == (2, 5, 50) and out.is_contiguous()
    torch.testing.assert_close(out.double(), reference(x, weight, scale, None), rtol=1e-5, atol=1e-6 * 34)
    assert kernel.apply_quantized(x[:, :0], packed, scale, None).shape == (2, 0, 50)


def test_packed_weight_stays_fp8_and_owns_its_memory():
    gen = torch.Generator().manual_seed(2)
    weight, scale, x = fp8_weight(100, 64, gen), torch.tensor(0.01), torch.randn(3, 64, generator=gen)
    packed = kernel.pack_quantized(weight, scale, torch.float32)
    assert packed.shape == weight.shape and packed.dtype == weight.dtype
    assert packed.untyped_storage().nbytes() == weight.numel()  # one byte an element, no wider copy
    expected = kernel.apply_quantized(x, packed, scale, None).clone()
    weight.view(torch.uint8).zero_()
    assert torch.equal(kernel.apply_quantized(x, packed, scale, None), expected)


@pytest.mark.parametrize(
    ("weight", "scale", "dtype"),
    [
        (torch.zeros(8, 8, dtype=torch.float8_e4m3fn), torch.tensor(1.0), torch.float16),  # activations
        (torch.zeros(8, 9, dtype=torch.float8_e4m3fn), torch.tensor(1.0), torch.float32),  # odd in_features
        (torch.zeros(8, 8, dtype=torch.float8_e5m2), torch.tensor(1.0), torch.float32),  # another FP8
        (torch.zeros(8, 8, dtype=torch.float8_e4m3fn), torch.ones(4, 1), torch.float32),  # grouped scales
        (torch.zeros(8, 8), torch.tensor(1.0), torch.float32),  # not quantized
    ],
    ids=["float16", "odd_in_features", "e5m2", "scale_groups", "float32_weight"],
)
def test_what_it_does_not_run_stays_with_the_method(weight, scale, dtype):
    assert kernel.pack_quantized(weight, scale, dtype) is None


def test_the_op_says_what_is_wrong_with_its_inputs():
    ops = torch.ops.kvserve_cpu_linear
    packed = ops.pack_fp8(torch.zeros(50, 34, dtype=torch.float8_e4m3fn))
    with pytest.raises(RuntimeError, match=r"scale must be a contiguous float32 tensor of 1 or 50 elements"):
        ops.fp8_linear(torch.randn(2, 34), packed, torch.ones(3), None)
    with pytest.raises(RuntimeError, match=r"x must be a CPU tensor \[\.\.\., 34\]"):
        ops.fp8_linear(torch.randn(2, 34, dtype=torch.float16), packed, torch.ones(1), None)
    with pytest.raises(RuntimeError, match="need an even in_features"):
        ops.pack_fp8(torch.zeros(4, 3, dtype=torch.float8_e4m3fn))


def test_fp8_layers_move_onto_the_kernel_when_the_engine_packs():
    """The seam end to end: a fused FP8 layer whose shards keep their own scales (per-row scales on
    the CPU) is moved onto the kernel by ``pack_linear_weights`` and computes the dequantized shards."""
    pytest.importorskip("kvserve_quant_fp8")
    from kvserve.layers import MergedColumnLinear, load_checkpoint, pack_linear_weights
    from kvserve.runner.build import default_dtype
    from kvserve_quant_fp8.fp8_method import Fp8Method

    gen = torch.Generator().manual_seed(3)
    method = Fp8Method({"quant_method": "fp8", "activation_scheme": "dynamic"})
    with default_dtype(torch.bfloat16):
        layer = MergedColumnLinear(64, [48, 32], False, method, "mlp.gate_up_proj", ["mlp.gate_proj", "mlp.up_proj"])
    model = torch.nn.Module()
    model.mlp = torch.nn.Module()
    model.mlp.gate_up_proj = layer
    shards = {name: (fp8_weight(n, 64, gen), torch.tensor(s)) for name, n, s in [("gate", 48, 0.01), ("up", 32, 0.003)]}
    tensors = [
        (f"mlp.{name}_proj.{key}", t)
        for name, (w, s) in shards.items()
        for key, t in [("weight", w), ("weight_scale", s)]
    ]
    load_checkpoint(model, tensors)
    layer.quant_method.process_weights_after_loading(layer)
    report = pack_linear_weights(model, kernel)
    assert report.quantized_layers == 1 and "+ 1 quantized" in str(report)
    assert layer.fp8_kernel is kernel and layer.weight.dtype == torch.float8_e4m3fn
    x = torch.randn(5, 64, generator=gen).bfloat16()
    with torch.no_grad():
        out = layer(x)
    expected = torch.cat([reference(x, w, s, None) for w, s in shards.values()], dim=-1)
    torch.testing.assert_close(out.double(), expected, rtol=2**-8, atol=1e-3)
