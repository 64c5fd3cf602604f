"""The CPU platform's own GEMM (AVX-512 or AVX2): products within rounding of a float64 reference at every edge of
its tiling (row tiles and blocks, panel widths, k chunks), packed weights that keep the seam's
contract, clear errors from its op, other dtypes on the fallback, and oneDNN alone (saying why)
where the kernel cannot be built."""

import logging
import time

import pytest
import torch
import torch.nn.functional as F

from kvserve_cpu_native import cpu_name_and_flags
from kvserve_platform_cpu import native_linear
from kvserve_platform_cpu.native_layer_ops import cpu_layer_ops
from kvserve_platform_cpu.native_linear import NativeLinearKernel, native_linear_kernel
from kvserve_platform_cpu.onednn_linear import OneDnnLinearKernel, onednn_linear_kernel

kernel = native_linear_kernel(None)
unavailable = native_linear.unavailable_reason(native_linear.LIBRARY, native_linear.SOURCES)
pytestmark = pytest.mark.skipif(
    not isinstance(kernel, NativeLinearKernel),
    reason=f"no native linear kernel here: {unavailable or 'this CPU runs none of its dtypes'}",
)
onednn = onednn_linear_kernel()

# Rows: one, a partial row tile (7), exactly one (8), one and a row (9), rows the AVX2 path shares
# evenly among its tiles (10: 5 + 5; 16: 6 + 5 + 5; 32), a 64-row AVX2 block and a row (65), and 257:
# two full 128-row blocks and a one-row block.
ROWS = [1, 7, 8, 9, 10, 16, 32, 65, 257]
# (out features, in features): a full 48-wide panel and a 2-wide one (50), a panel narrower than
# 48 whose third vector is empty (17), fewer columns than one vector (2), two full panels over a k
# that is neither a multiple of 256 nor below it (96, 300: chunks of 256 and 44), and an LM-head-like
# 1280 x 768 (three chunks); k of 2, 34 and 130 are below one chunk.
SIZES = [(50, 34), (17, 130), (2, 2), (96, 300), (1280, 768)]
# On AMX, bfloat16 weights whose sizes fill its tiles (32-column panels, k in 32s) run there: one k
# tile over two panels (64, 32), three k tiles (160, 96), and the LM-head-like 1280 x 768 above.
AMX_SIZES = [(64, 32), (160, 96)]
AMX = "amx_bf16" in cpu_name_and_flags()[1]


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The exact product (float64) of the inputs as the kernel sees them."""
    return F.linear(x.double(), weight.double(), None if bias is None else bias.double())


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize(("n", "k"), SIZES)
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_float32_products_match_float64(m, n, k, bias):
    gen = torch.Generator().manual_seed(m * n + k)
    weight, x = torch.randn(n, k, generator=gen), torch.randn(m, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    out = kernel.apply(x, kernel.pack(weight), b)
    assert out.shape == (m, n) and out.dtype == torch.float32 and out.is_contiguous()
    # FMA in k order: rounding grows with the k terms summed.
    torch.testing.assert_close(out.double(), reference(x, weight, b), rtol=1e-5, atol=1e-6 * k)


@pytest.mark.skipif(
    kernel is None or torch.bfloat16 not in getattr(kernel, "dtypes", ()),
    reason="the native kernel runs no bfloat16 here (no AVX512-BF16, or AMX: oneDNN's)",
)
@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize(("n", "k"), SIZES + AMX_SIZES)
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_bfloat16_products_match_float64(m, n, k, bias):
    gen = torch.Generator().manual_seed(m * n + k)
    weight, x = torch.randn(n, k, generator=gen).bfloat16(), torch.randn(m, k, generator=gen).bfloat16()
    b = torch.randn(n, generator=gen).bfloat16() if bias else None
    packed = kernel.pack(weight)
    assert packed.shape == weight.shape and packed.dtype == torch.bfloat16
    out = kernel.apply(x, packed, b)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    # Exact products, float32 sums, one rounding to bfloat16 (half an ulp: 2**-8 relative).
    torch.testing.assert_close(out.double(), reference(x, weight, b), rtol=2**-8, atol=1e-3)


def test_leading_dimensions_and_strided_rows_are_kept():
    gen = torch.Generator().manual_seed(1)
    weight, b = torch.randn(50, 34, generator=gen), torch.randn(50, generator=gen)
    x = torch.randn(2, 5, 48, generator=gen)[..., :34]  # not contiguous
    assert not x.is_contiguous()
    out = kernel.apply(x, kernel.pack(weight), b)
    assert out.shape == (2, 5, 50) and out.is_contiguous()
    torch.testing.assert_close(out.double(), reference(x, weight, b), rtol=1e-5, atol=1e-6 * 34)
    # No rows: an empty result of the right shape.
    assert kernel.apply(x[:, :0], kernel.pack(weight), b).shape == (2, 0, 50)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_weight_keeps_shape_and_dtype_and_owns_its_memory(dtype):
    if dtype not in kernel.dtypes:
        pytest.skip(f"the native kernel does not run {dtype} here")
    weight = torch.randn(100, 64).to(dtype)
    x = torch.randn(3, 64).to(dtype)
    packed = kernel.pack(weight)
    assert packed.shape == weight.shape and packed.dtype == dtype and packed.device == weight.device
    assert not torch.equal(packed, weight)  # reordered into panels
    expected = kernel.apply(x, packed, None).clone()
    weight.zero_()
    assert torch.equal(kernel.apply(x, packed, None), expected)
    assert expected.abs().sum() > 0


def test_bfloat16_with_odd_in_features_stays_dense():
    if torch.bfloat16 not in kernel.dtypes:
        pytest.skip("the native kernel does not run bfloat16 here")
    # AVX-512's vdpbf16ps multiplies pairs of k; an odd in_features is left to F.linear on every build.
    assert kernel.pack(torch.randn(16, 33).bfloat16()) is None


@pytest.mark.parametrize(
    "weight",
    [
        torch.randn(8, 8, dtype=torch.float16),
        torch.randn(8, 8, dtype=torch.float64),
        torch.empty(8, 8, device="meta"),  # not on the CPU
        torch.randn(8),  # not a matrix
    ],
    ids=["float16", "float64", "meta", "vector"],
)
def test_weights_it_does_not_run_stay_dense(weight):
    assert kernel.pack(weight) is None  # no fallback: F.linear
    if onednn is not None:
        # With oneDNN as the fallback, what oneDNN does: it packs none of these either.
        assert onednn.pack(weight) is None
        assert NativeLinearKernel(kernel.dtypes, onednn).pack(weight) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_weight_without_in_features_stays_dense(dtype):
    # The op cannot take x with no features (it raises on every call); F.linear gives the bias.
    assert kernel.pack(torch.randn(8, 0).to(dtype)) is None


@pytest.mark.skipif(
    onednn is None or torch.bfloat16 not in onednn.dtypes, reason="oneDNN has no native bfloat16 on this CPU"
)
def test_dtypes_outside_the_kernel_go_to_the_fallback():
    float32_only = NativeLinearKernel(frozenset({torch.float32}), onednn)
    gen = torch.Generator().manual_seed(2)
    weight, x = torch.randn(40, 24, generator=gen).bfloat16(), torch.randn(3, 24, generator=gen).bfloat16()
    b = torch.randn(40, generator=gen).bfloat16()
    packed = float32_only.pack(weight)
    assert packed.is_mkldnn and packed.shape == weight.shape  # oneDNN's blocked tensor
    out = float32_only.apply(x, packed, b)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, onednn.apply(x, packed, b), rtol=0, atol=0)
    # The kernel's own dtype still runs on its own op: a strided tensor in its panel layout.
    own = float32_only.pack(weight.float())
    assert not own.is_mkldnn and torch.equal(own, kernel.pack(weight.float()))


def test_the_op_says_what_is_wrong_with_its_inputs():
    packed = kernel.pack(torch.randn(50, 34))
    with pytest.raises(RuntimeError, match=r"x must be a CPU tensor \[\.\.\., 34\] of the weight's dtype Float"):
        kernel.apply(torch.randn(2, 34, dtype=torch.float64), packed, None)
    with pytest.raises(RuntimeError, match=r"x must be a CPU tensor \[\.\.\., 34\]"):
        kernel.apply(torch.randn(2, 33), packed, None)
    with pytest.raises(RuntimeError, match=r"x must be a CPU tensor \[\.\.\., 34\] of the weight's dtype Float"):
        kernel.apply_logits(torch.randn(2, 34, dtype=torch.bfloat16), packed)
    with pytest.raises(RuntimeError, match=r"bias must be a contiguous \[50\] tensor of x's dtype"):
        kernel.apply(torch.randn(2, 34), packed, torch.randn(49))
    with pytest.raises(RuntimeError, match=r"bias must be a contiguous \[50\] tensor of x's dtype"):
        kernel.apply(torch.randn(2, 34), packed, torch.randn(50, dtype=torch.float64))
    with pytest.raises(RuntimeError, match=r"bias must be a contiguous \[50\] tensor"):
        kernel.apply(torch.randn(2, 34), packed, torch.randn(100)[::2])
    with pytest.raises(RuntimeError, match="the weight must be a contiguous 2-D CPU tensor"):
        torch.ops.kvserve_cpu_linear.pack(torch.randn(34, 50).t())
    with pytest.raises(RuntimeError, match="dtype Half is not run by this build"):
        torch.ops.kvserve_cpu_linear.pack(torch.randn(8, 8, dtype=torch.float16))


def test_its_dtypes_are_what_the_build_and_cpu_run():
    ops = torch.ops.kvserve_cpu_linear
    assert ops.supports(torch.float32) and torch.float32 in kernel.dtypes
    assert (torch.bfloat16 in kernel.dtypes) == ops.supports(torch.bfloat16)
    assert not ops.supports(torch.float16) and not ops.supports(torch.float64)
    assert ops.amx() == (AMX and ops.supports(torch.bfloat16))  # -march=native: AMX where the CPU has it
    # -march=native: AVX-512 where the CPU has it, else AVX2 (the build needs one of them).
    assert ops.isa() == ("avx512" if "avx512f" in cpu_name_and_flags()[1] else "avx2")
    named = NativeLinearKernel(kernel.dtypes, None)
    named.pack(torch.randn(64, 64))
    assert named.name == ops.isa()  # float32 never runs on AMX
    if torch.bfloat16 in kernel.dtypes:
        named.pack(torch.randn(64, 64).bfloat16())
        assert named.name == ("avx512+amx" if ops.amx() else ops.isa())


def panels(weight: torch.Tensor, width: int, pair: int) -> torch.Tensor:
    """The documented layout, independently: column panels of ``width``, each holding per ``pair``
    of k its columns' pairs (or single weights) in column order."""
    n, k = weight.shape
    pieces = [p.reshape(p.shape[0], k // pair, pair).transpose(0, 1).reshape(-1) for p in weight.split(width)]
    return torch.cat(pieces).reshape(n, k)


@pytest.mark.skipif(
    torch.bfloat16 not in getattr(kernel, "dtypes", ()), reason="the native kernel runs no bfloat16 here"
)
@pytest.mark.parametrize(("n", "k"), [(64, 32), (1280, 768), (50, 34), (96, 300), (80, 64)])
def test_bfloat16_panels_are_32_wide_where_amx_tiles_take_the_weight_else_48_or_16_on_avx2(n, k):
    weight = torch.randn(n, k).bfloat16()
    if torch.ops.kvserve_cpu_linear.isa() == "avx2":  # widened to float32: single k, two 8-float vectors
        assert torch.equal(kernel.pack(weight), panels(weight, 16, pair=1))
        return
    amx_tiles = torch.ops.kvserve_cpu_linear.amx() and n % 32 == 0 and k % 32 == 0
    assert torch.equal(kernel.pack(weight), panels(weight, 32 if amx_tiles else 48, pair=2))


def test_float32_panels_are_48_wide_or_16_on_avx2():
    weight = torch.randn(50, 34)
    width = 16 if torch.ops.kvserve_cpu_linear.isa() == "avx2" else 48
    assert torch.equal(kernel.pack(weight), panels(weight, width, pair=1))


def test_without_the_native_build_the_fallback_serves_and_the_log_says_why(monkeypatch, caplog):
    monkeypatch.setattr(native_linear, "unavailable_reason", lambda name, sources: "no C++ compiler (test)")
    # The kvserve logger stops propagating once configured; let caplog's root handler see it.
    monkeypatch.setattr(logging.getLogger("kvserve"), "propagate", True)
    fallback = OneDnnLinearKernel(frozenset({torch.float32}))
    with caplog.at_level(logging.WARNING, logger="kvserve"):
        assert native_linear_kernel(fallback) is fallback
        assert native_linear_kernel(None) is None
    # Distinct messages: after some other tests in one session each record reaches caplog twice.
    warnings = {r.getMessage() for r in caplog.records if r.levelno == logging.WARNING}
    assert warnings == {
        f"kvserve-platform-cpu: native linear kernel unavailable, using {instead}: no C++ compiler (test)"
        for instead in ("onednn", "F.linear")
    }


GATED_DTYPES = [dtype for dtype in (torch.float32, torch.bfloat16) if dtype in getattr(kernel, "dtypes", ())]


@pytest.mark.parametrize("m", [1, 7, 9, 32, 65, 257])
@pytest.mark.parametrize(("n", "k"), SIZES + AMX_SIZES)
@pytest.mark.parametrize("dtype", GATED_DTYPES)
def test_gated_product_equals_two_products_and_the_layer_op(m, n, k, dtype):
    """silu(x G^T) * (x U^T) in one op: bit for bit what two products and the fused SiLU-and-mul op give."""
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    gate, up = (kernel.pack(torch.randn(n, k, generator=gen).to(dtype)) for _ in range(2))
    x = torch.randn(m, k, generator=gen).to(dtype)
    expected = cpu_layer_ops().silu_and_mul(kernel.apply(x, gate, None), kernel.apply(x, up, None))
    assert kernel.fuses_gated("silu", gate)
    assert torch.equal(kernel.apply_gated(x, gate, up, "silu"), expected)


def test_gated_product_takes_only_silu_on_its_dtypes_and_names_mismatched_weights():
    packed = kernel.pack(torch.randn(50, 34))
    assert not kernel.fuses_gated("gelu_tanh", packed)
    assert not kernel.fuses_gated("silu", torch.randn(50, 34).half())
    with pytest.raises(RuntimeError, match="gate and up must be packed weights of one shape and dtype"):
        kernel.apply_gated(torch.randn(2, 34), packed, kernel.pack(torch.randn(48, 34)), "silu")


@pytest.mark.parametrize("m", [0, 1, 7, 9, 32, 65, 257])
@pytest.mark.parametrize(("n", "k"), SIZES + AMX_SIZES)
@pytest.mark.parametrize("dtype", GATED_DTYPES)
def test_logits_are_the_product_widened_to_float32(m, n, k, dtype):
    """The LM head's float32 logits: bit for bit the product in x's dtype, widened (bfloat16 on the
    AVX-512 panels writes them itself); leading dimensions kept."""
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    packed = kernel.pack(torch.randn(n, k, generator=gen).to(dtype))
    x = torch.randn(m, k, generator=gen).to(dtype)
    logits = kernel.apply_logits(x, packed)
    assert logits.dtype == torch.float32 and logits.is_contiguous()
    assert torch.equal(logits, kernel.apply(x, packed, None).float())
    batched = x.repeat(2, 1).reshape(2, m, k)
    assert torch.equal(kernel.apply_logits(batched, packed), logits.repeat(2, 1).reshape(2, m, n))


def test_compiled_graph_calls_the_op_and_matches_eager():
    """Costs ~8 s on 2 cores (inductor builds one small C++ kernel for the + 1)."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(3)
    weight, x = torch.randn(50, 34, generator=gen), torch.randn(9, 34, generator=gen)
    packed = kernel.pack(weight)

    def step(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        gated = kernel.apply_gated(x, packed, packed, "silu")
        return kernel.apply(x, packed, None) + gated + kernel.apply_logits(x, packed)

    start = time.perf_counter()
    compiled, code = run_and_get_code(torch.compile(step, fullgraph=True), x, packed)
    print(f"torch.compile of one linear, one gated product and logits: {time.perf_counter() - start:.1f} s")
    for op in ("linear", "gated_linear", "logits"):
        assert f"torch.ops.kvserve_cpu_linear.{op}.default(" in "\n".join(code)
    torch.testing.assert_close(compiled, step(x, packed), rtol=0, atol=0)
