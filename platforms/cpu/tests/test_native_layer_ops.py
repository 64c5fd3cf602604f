"""The CPU platform's fused C++ layer ops against core's PyTorch ones (HF's numerics), over dtypes,
odd sizes, one row and many, per-head and qkv views, and their refusals."""

from __future__ import annotations

import pytest
import torch

from kvserve.layers import TorchLayerOps
from kvserve_cpu_native import build_failure_reason
from kvserve_platform_cpu.native_layer_ops import NativeLayerOps, cpu_layer_ops

pytestmark = pytest.mark.skipif(build_failure_reason() is not None, reason=f"no native build: {build_failure_reason()}")

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SHAPES = [(1, 576), (32, 576), (7, 33), (300, 1000), (3, 1)]
reference = TorchLayerOps()


@pytest.fixture(scope="module")
def native() -> NativeLayerOps:
    ops = cpu_layer_ops()
    assert isinstance(ops, NativeLayerOps), ops.describe()
    return ops


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """float32: rounding of a differently ordered sum of squares; half types: two units in the last place
    (Llama's norm rounds twice, so one unit off in the first rounding can become two)."""
    return {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.float16: {"rtol": 2e-3, "atol": 1e-5}}.get(dtype, {})


def tensors(shape, dtype, count, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen).to(dtype) for _ in range(count)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_and_the_fused_add(native, dtype, shape, offset):
    x, residual, weight = tensors(shape, dtype, 2) + tensors(shape[-1:], dtype, 1, seed=1)
    out = native.rms_norm(x, weight, 1e-6, offset)
    assert out.dtype == dtype and out.shape == x.shape and out.is_contiguous()
    torch.testing.assert_close(out, reference.rms_norm(x, weight, 1e-6, offset), **tolerance(dtype))
    before = (x.clone(), residual.clone())
    normed, summed = native.fused_add_rms_norm(x, residual, weight, 1e-6, offset)
    expected_normed, expected_sum = reference.fused_add_rms_norm(x, residual, weight, 1e-6, offset)
    assert torch.equal(summed, expected_sum)  # the add rounds exactly as the unfused one
    torch.testing.assert_close(normed, expected_normed, **tolerance(dtype))
    assert torch.equal(x, before[0]) and torch.equal(residual, before[1])  # out of place


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_of_per_head_views_and_a_transposed_input(native, dtype):
    qkv, weight = tensors((5, 8 * 18), dtype, 1) + tensors((18,), dtype, 1, seed=1)
    q = qkv[:, : 4 * 18].view(5, 4, 18)  # row-strided, as a fused qkv projection's split gives
    torch.testing.assert_close(native.rms_norm(q, weight, 1e-6, 1.0), reference.rms_norm(q, weight, 1e-6, 1.0))
    transposed = torch.randn(18, 6).to(dtype).t()  # last dimension not contiguous: copied first
    torch.testing.assert_close(
        native.rms_norm(transposed, weight, 1e-6, 0.0), reference.rms_norm(transposed, weight, 1e-6, 0.0)
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES + [(2, 3, 40)])
def test_silu_and_mul(native, dtype, shape):
    gate, up = tensors(shape, dtype, 2)
    gate = gate * 6  # reach where silu saturates
    torch.testing.assert_close(native.silu_and_mul(gate, up), reference.silu_and_mul(gate, up), **tolerance(dtype))
    fused = torch.cat([gate, up], dim=-1)  # the two halves of one projection, as views
    half = shape[-1]
    torch.testing.assert_close(
        native.silu_and_mul(fused[..., :half], fused[..., half:]), reference.silu_and_mul(gate, up), **tolerance(dtype)
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "heads", "kv_heads", "head_dim"), [(1, 9, 3, 64), (37, 4, 2, 18), (5, 2, 1, 128)])
def test_rotary_embedding_of_qkv_views(native, dtype, tokens, heads, kv_heads, head_dim):
    (qkv,) = tensors((tokens, (heads + 2 * kv_heads) * head_dim), dtype, 1)
    q, k, _ = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k = q.view(tokens, heads, head_dim), k.view(tokens, kv_heads, head_dim)
    angles = torch.outer(torch.arange(200.0), torch.rand(head_dim // 2, generator=torch.Generator().manual_seed(2)))
    cos, sin = angles.cos(), angles.sin()
    positions = torch.randint(0, 200, (tokens,), generator=torch.Generator().manual_seed(3))
    got, expected = (
        native.rotary_embedding(positions, q, k, cos, sin),
        reference.rotary_embedding(positions, q, k, cos, sin),
    )
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == dtype and a.is_contiguous()
        torch.testing.assert_close(a, b, **tolerance(dtype))


def test_wrong_arguments_are_refused_naming_them(native):
    x = torch.randn(4, 16)
    with pytest.raises(RuntimeError, match="weight dtype"):
        native.rms_norm(x, torch.ones(16, dtype=torch.bfloat16), 1e-6, 0.0)
    with pytest.raises(RuntimeError, match=r"weight must be \[16\]"):
        native.rms_norm(x, torch.ones(8), 1e-6, 0.0)
    with pytest.raises(RuntimeError, match="residual must match x"):
        native.fused_add_rms_norm(x, torch.randn(4, 8), torch.ones(16), 1e-6, 0.0)
    with pytest.raises(RuntimeError, match="gate and up"):
        native.silu_and_mul(x, torch.randn(4, 8))
    q, k, table = torch.randn(2, 2, 16), torch.randn(2, 1, 16), torch.randn(10, 8)
    with pytest.raises(RuntimeError, match=r"positions must lie in \[0, 10\)"):
        native.rotary_embedding(torch.tensor([0, 10]), q, k, table, table)
    with pytest.raises(RuntimeError, match="cos and sin must be float32"):
        native.rotary_embedding(torch.tensor([0, 1]), q, k, table.double(), table.double())
