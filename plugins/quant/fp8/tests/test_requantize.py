"""Fused shards with different per-tensor scales, requantized to one scale for a single-scale kernel."""

import torch

from kvserve_quant_fp8.fp8_linear import requantize_shards


def test_requantized_shards_keep_their_values_within_one_fp8_rounding():
    gen = torch.Generator().manual_seed(0)
    sizes = [32, 16, 16]
    scales = torch.tensor([0.01, 0.003, 0.02])
    original = [torch.randn(n, 24, generator=gen) * s * 100 for n, s in zip(sizes, scales, strict=True)]
    fp8 = torch.cat([(w / s).to(torch.float8_e4m3fn) for w, s in zip(original, scales, strict=True)])
    dequantized = fp8.float() * scales.repeat_interleave(torch.tensor(sizes))[:, None]

    requantized = requantize_shards(fp8, scales, sizes)
    assert requantized.dtype == torch.float8_e4m3fn
    got = requantized.float() * scales.max()
    # The largest-scale shard is unchanged; the others lose at most one E4M3 rounding (2^-4 relative).
    torch.testing.assert_close(got[48:], dequantized[48:], rtol=0, atol=0)
    relative = ((got - dequantized).abs() / dequantized.abs().clamp(min=scales.max() * 2**-6)).max()
    assert relative <= 2**-4, f"requantization moved a value by {relative:.3g} (relative)"
