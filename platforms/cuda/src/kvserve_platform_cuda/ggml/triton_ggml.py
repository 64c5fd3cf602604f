"""Dequantize-GEMM in Triton: ``y = x @ W.T`` for ``W`` held as GGML blocks, dequantized tile by tile.

Imported on first use (it imports triton): :class:`~kvserve_platform_cuda.ggml.kernel.TritonGGMLKernel`
asks for it when a GGUF model's layers are offered the kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvserve_platform_cuda.lora.common import INTERPRETED, block, dot, dot_fp32

TYPES: dict[str, tuple[int, int, int]] = {
    "Q4_0": (0, 32, 18),
    "Q4_1": (1, 32, 20),
    "Q5_0": (2, 32, 22),
    "Q5_1": (3, 32, 24),
    "Q8_0": (4, 32, 34),
    "Q4_K": (5, 256, 144),
    "Q5_K": (6, 256, 176),
    "Q6_K": (7, 256, 210),
}
"""gguf's type name -> (the kernel's ``KIND``, weights per block, bytes per block); the layouts are
gguf-py's ``quants.py`` (and ``kvserve_quant_gguf/ggml.py``, which follows it)."""


@triton.jit
def _byte(q_ptr, offset):
    return tl.load(q_ptr + offset).to(tl.int32)


@triton.jit
def _dequantize(q_ptr, h_ptr, base, j, KIND: tl.constexpr):
    """Weight ``j`` of the blocks starting at byte offsets ``base`` (same shape as ``j``), float32.

    ``h_ptr`` is the same bytes as float16: every block's size is even, so its float16 fields are
    aligned and read as one load each instead of two bytes put together."""
    half = base // 2
    if KIND == 7:  # Q6_K: ql[128], qh[64], 16 int8 scales, d
        low = (_byte(q_ptr, base + (j // 128) * 64 + j % 64) >> (((j // 64) % 2) * 4)) & 0xF
        high = (_byte(q_ptr, base + 128 + (j // 128) * 32 + j % 32) >> (((j // 32) % 4) * 2)) & 3
        scale = tl.load(q_ptr + base + 192 + j // 16).to(tl.int8, bitcast=True).to(tl.float32)
        d = tl.load(h_ptr + half + 104).to(tl.float32)
        return (d * scale) * ((low | (high << 4)) - 32).to(tl.float32)
    d = tl.load(h_ptr + half).to(tl.float32)
    if KIND == 5 or KIND == 6:  # Q4_K / Q5_K: d, dmin, 12 bytes of 6-bit scales and mins, [qh[32],] qs[128]
        sub = j // 32
        a = _byte(q_ptr, base + 4 + sub % 4)
        b = _byte(q_ptr, base + 8 + sub % 4)
        c = _byte(q_ptr, base + 12 + sub % 4)
        sc = tl.where(sub < 4, a & 0x3F, (c & 0x0F) | ((a >> 2) & 0x30))
        mn = tl.where(sub < 4, b & 0x3F, (c >> 4) | ((b >> 2) & 0x30))
        # 32 bytes hold 64 weights: a sub-block in their low nibbles, the next in their high ones
        qs_start = 16 if KIND == 5 else 48
        q = (_byte(q_ptr, base + qs_start + (j // 64) * 32 + j % 32) >> ((sub % 2) * 4)) & 0xF
        if KIND == 6:  # bit s of qh[j % 32] is the fifth bit of sub-block s's weight
            q = q | (((_byte(q_ptr, base + 16 + j % 32) >> sub) & 1) << 4)
        dmin = tl.load(h_ptr + half + 1).to(tl.float32)
        return (d * sc.to(tl.float32)) * q.to(tl.float32) - dmin * mn.to(tl.float32)
    if KIND == 4:  # Q8_0: d, 32 int8
        return tl.load(q_ptr + base + 2 + j).to(tl.int8, bitcast=True).to(tl.float32) * d
    # 4-bit types: byte j % 16 holds weight j in its low nibble and weight j + 16 in its high one
    qs_start = 2 if KIND == 0 else 4 if KIND == 1 else 6 if KIND == 2 else 8
    q = (_byte(q_ptr, base + qs_start + (j % 16)) >> ((j // 16) * 4)) & 0xF
    if KIND == 2 or KIND == 3:  # Q5: bit j of the little-endian 32-bit qh is weight j's fifth
        qh_start = 2 if KIND == 2 else 4
        q = q | (((_byte(q_ptr, base + qh_start + j // 8) >> (j % 8)) & 1) << 4)
    if KIND == 0:
        return (q - 8).to(tl.float32) * d
    if KIND == 2:
        return (q - 16).to(tl.float32) * d
    m = tl.load(h_ptr + half + 1).to(tl.float32)  # Q4_1 / Q5_1: d, m, then the quants
    return d * q.to(tl.float32) + m


@triton.jit
def _ggml_linear_kernel(
    x_ptr, q_ptr, h_ptr, y_ptr,
    M, N, K, stride_xm, stride_xk, stride_ym, stride_yn,
    KIND: tl.constexpr, BLOCK_WEIGHTS: tl.constexpr, BLOCK_BYTES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr,
):  # fmt: skip
    # one program: BLOCK_M rows x BLOCK_N output features; each K step dequantizes a
    # [BLOCK_K, BLOCK_N] tile of W.T (its part of each feature's blocks) and multiplies it at once
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    row_bytes = (K // BLOCK_WEIGHTS) * BLOCK_BYTES
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(
            x_ptr + rows[:, None] * stride_xm + ks[None, :] * stride_xk, mask=row_ok[:, None] & k_ok[None, :], other=0.0
        )
        # out-of-range features and k read block 0 of feature 0 (always there): no masked loads
        # inside the dequantization, the tile's invalid entries are zeroed after it instead
        w_ok = k_ok[:, None] & col_ok[None, :]
        base = tl.where(w_ok, cols[None, :].to(tl.int64) * row_bytes + (ks[:, None] // BLOCK_WEIGHTS) * BLOCK_BYTES, 0)
        j = ks[:, None] % BLOCK_WEIGHTS + tl.zeros([BLOCK_K, BLOCK_N], dtype=tl.int32)
        w = tl.where(w_ok, _dequantize(q_ptr, h_ptr, base, j, KIND), 0.0)
        # rounded to x's dtype as the dequantized weight F.linear would multiply is
        acc += dot(x, w.to(x_ptr.dtype.element_ty), DOT_FP32)
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :] * stride_yn, acc, mask=row_ok[:, None] & col_ok[None, :])


@torch.library.custom_op("kvserve_cuda_ggml::ggml_linear", mutates_args=())
def ggml_linear(x: torch.Tensor, blocks: torch.Tensor, ggml_type: str, out_features: int) -> torch.Tensor:
    """float32 ``x @ W.T`` for ``x`` ``[M, K]`` and ``W`` ``[out_features, K]`` as the flat uint8
    ``blocks`` of ``ggml_type`` (one of :data:`TYPES`), one opaque op for ``torch.compile``."""
    kind, block_weights, block_bytes = TYPES[ggml_type]
    m, k = x.shape
    if k % block_weights or blocks.numel() != out_features * (k // block_weights) * block_bytes:
        raise ValueError(
            f"GGML {ggml_type}: {blocks.numel()} bytes are not {out_features} rows of {k} weights "
            f"({k // block_weights} blocks of {block_bytes} bytes each, in_features a multiple of {block_weights})"
        )
    y = torch.empty(m, out_features, dtype=torch.float32, device=x.device)
    blocks = blocks.contiguous()
    # the interpreter pays per operation, not per element: the widest tiles there
    block_m = block(m, 64)
    block_n = block(out_features, 128 if INTERPRETED else 64)
    block_k = block(k, 256 if INTERPRETED else 64)
    grid = (triton.cdiv(m, block_m), triton.cdiv(out_features, block_n))
    _ggml_linear_kernel[grid](
        x, blocks, blocks.view(torch.float16), y, m, out_features, k, *x.stride(), *y.stride(),
        KIND=kind, BLOCK_WEIGHTS=block_weights, BLOCK_BYTES=block_bytes,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, DOT_FP32=dot_fp32(x.dtype),
    )  # fmt: skip
    return y


@ggml_linear.register_fake
def _(x: torch.Tensor, blocks: torch.Tensor, ggml_type: str, out_features: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], out_features), dtype=torch.float32)
