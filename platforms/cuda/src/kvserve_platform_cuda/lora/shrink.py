"""Shrink: ``h[t] = x[t] @ lora_a[slot(t)]``, down from the layer's input to the slices' ranks."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvserve_platform_cuda.lora.common import INTERPRETED, SEGMENT_TILE, block, dot, dot_fp32


@triton.jit
def _sgmv_shrink_kernel(
    x_ptr, a_ptr, h_ptr, tiles_ptr,
    stride_xt, stride_xk, stride_as, stride_ak, stride_an, stride_ht, stride_hn,
    in_features, width,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr,
):  # fmt: skip
    # one program: BLOCK_M tokens of one segment (all one slot) x BLOCK_N of the ranks' columns
    tile = tl.program_id(0)
    start = tl.load(tiles_ptr + tile * 3)
    stop = tl.load(tiles_ptr + tile * 3 + 1)
    slot = tl.load(tiles_ptr + tile * 3 + 2)
    rows = start + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < stop, cols < width
    a_slot = a_ptr + slot * stride_as
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, in_features, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < in_features
        a_mask = k_ok[:, None] & col_ok[None, :]
        x = tl.load(
            x_ptr + rows[:, None] * stride_xt + ks[None, :] * stride_xk, mask=row_ok[:, None] & k_ok[None, :], other=0.0
        )
        a = tl.load(a_slot + ks[:, None] * stride_ak + cols[None, :] * stride_an, mask=a_mask, other=0.0)
        acc += dot(x, a, DOT_FP32)
    tl.store(
        h_ptr + rows[:, None] * stride_ht + cols[None, :] * stride_hn,
        acc.to(h_ptr.dtype.element_ty),
        mask=row_ok[:, None] & col_ok[None, :],
    )


@triton.jit
def _bgmv_shrink_kernel(
    x_ptr, a_ptr, h_ptr, rows_ptr, slots_ptr,
    stride_xt, stride_xk, stride_as, stride_ak, stride_an, stride_ht, stride_hn,
    in_features, width,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # one program: one token (a decode row) x BLOCK_N of the ranks' columns, a vector-matrix product
    index = tl.program_id(0)
    row = tl.load(rows_ptr + index)
    slot = tl.load(slots_ptr + index)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < width
    a_slot = a_ptr + slot * stride_as
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, in_features, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < in_features
        a_mask = k_ok[:, None] & col_ok[None, :]
        x = tl.load(x_ptr + row * stride_xt + ks * stride_xk, mask=k_ok, other=0.0).to(tl.float32)
        a = tl.load(a_slot + ks[:, None] * stride_ak + cols[None, :] * stride_an, mask=a_mask, other=0.0).to(tl.float32)
        acc += tl.sum(x[:, None] * a, axis=0)
    tl.store(h_ptr + row * stride_ht + cols * stride_hn, acc.to(h_ptr.dtype.element_ty), mask=col_ok)


def shrink(
    x: torch.Tensor, lora_a: torch.Tensor, h: torch.Tensor, tiles: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor
) -> None:
    """Write ``h[t] = x[t] @ lora_a[slot]`` (``x`` ``[T, in]``, ``lora_a`` ``[slots, in, R]``, ``h``
    ``[T, R]``, any strides) for the tokens of ``tiles`` (int64 ``[n, 3]``: ``start, stop, slot``, at
    most :data:`SEGMENT_TILE` tokens each) and the one-token ``rows`` of ``slots`` (int64 ``[m]``);
    other rows of ``h`` are not written."""
    in_features, width = lora_a.shape[1], lora_a.shape[2]
    strides = (*x.stride(), *lora_a.stride(), *h.stride())
    block_n = block(width, 64)
    block_k = block(in_features, 256 if INTERPRETED else 64)
    if tiles.shape[0]:
        grid = (tiles.shape[0], triton.cdiv(width, block_n))
        _sgmv_shrink_kernel[grid](
            x, lora_a, h, tiles, *strides, in_features, width,
            BLOCK_M=SEGMENT_TILE, BLOCK_N=block_n, BLOCK_K=block_k, DOT_FP32=dot_fp32(x.dtype),
        )  # fmt: skip
    if rows.shape[0]:
        grid = (rows.shape[0], triton.cdiv(width, block_n))
        _bgmv_shrink_kernel[grid](
            x, lora_a, h, rows, slots, *strides, in_features, width, BLOCK_N=block_n, BLOCK_K=block_k
        )  # fmt: skip
