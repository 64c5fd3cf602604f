"""Expand: ``y[t, o_s : o_s + out_s] += h[t, s·r : (s+1)·r] @ lora_b[s][slot(t)]``, every output slice
of a packed layer (q, k, v) in one launch."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from kvserve_platform_cuda.lora.common import INTERPRETED, SEGMENT_TILE, block, dot, dot_fp32


def slice_table(lora_b: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """int64 ``[slices, 6]`` on ``device``, a row per slice: ``lora_b[s]``'s address, its first output
    column in ``y``, its width and its three strides. The slices are separate tensors of different
    widths; one launch reaches them all through it."""
    rows, offset = [], 0
    for b in lora_b:
        rows.append([b.data_ptr(), offset, b.shape[2], *b.stride()])
        offset += b.shape[2]
    return torch.tensor(rows, dtype=torch.int64, device=device)


@triton.jit
def _load_slice(table_ptr, s, stride_table, element_ty):
    row = table_ptr + s * stride_table
    b_ptr = tl.load(row).to(tl.pointer_type(element_ty))
    return b_ptr, tl.load(row + 1), tl.load(row + 2), tl.load(row + 3), tl.load(row + 4), tl.load(row + 5)


@triton.jit
def _sgmv_expand_kernel(
    y_ptr, h_ptr, table_ptr, tiles_ptr,
    stride_yt, stride_yn, stride_ht, stride_hr, stride_table,
    rank,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, DOT_FP32: tl.constexpr,
):  # fmt: skip
    # one program: BLOCK_M tokens of one segment x BLOCK_N output columns of one slice
    tile, s = tl.program_id(0), tl.program_id(1)
    b_ptr, offset, width, stride_bs, stride_br, stride_bn = _load_slice(
        table_ptr, s, stride_table, y_ptr.dtype.element_ty
    )
    cols = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    if tl.program_id(2) * BLOCK_N >= width:  # the grid spans the widest slice
        return
    start = tl.load(tiles_ptr + tile * 3)
    stop = tl.load(tiles_ptr + tile * 3 + 1)
    slot = tl.load(tiles_ptr + tile * 3 + 2)
    rows = start + tl.arange(0, BLOCK_M)
    row_ok, col_ok = rows < stop, cols < width
    b_slot = b_ptr + slot * stride_bs
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for r0 in range(0, rank, BLOCK_R):
        rs = r0 + tl.arange(0, BLOCK_R)
        r_ok = rs < rank
        b_mask = r_ok[:, None] & col_ok[None, :]
        h = tl.load(
            h_ptr + rows[:, None] * stride_ht + (s * rank + rs)[None, :] * stride_hr,
            mask=row_ok[:, None] & r_ok[None, :],
            other=0.0,
        )
        b = tl.load(b_slot + rs[:, None] * stride_br + cols[None, :] * stride_bn, mask=b_mask, other=0.0)
        acc += dot(h, b, DOT_FP32)
    y_tile = y_ptr + rows[:, None] * stride_yt + (offset + cols)[None, :] * stride_yn
    mask = row_ok[:, None] & col_ok[None, :]
    y = tl.load(y_tile, mask=mask).to(tl.float32)
    tl.store(y_tile, (y + acc).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bgmv_expand_kernel(
    y_ptr, h_ptr, table_ptr, rows_ptr, slots_ptr,
    stride_yt, stride_yn, stride_ht, stride_hr, stride_table,
    rank,
    BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    # one program: one token (a decode row) x BLOCK_N output columns of one slice
    index, s = tl.program_id(0), tl.program_id(1)
    b_ptr, offset, width, stride_bs, stride_br, stride_bn = _load_slice(
        table_ptr, s, stride_table, y_ptr.dtype.element_ty
    )
    cols = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    if tl.program_id(2) * BLOCK_N >= width:
        return
    row = tl.load(rows_ptr + index)
    slot = tl.load(slots_ptr + index)
    col_ok = cols < width
    b_slot = b_ptr + slot * stride_bs
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for r0 in range(0, rank, BLOCK_R):
        rs = r0 + tl.arange(0, BLOCK_R)
        r_ok = rs < rank
        b_mask = r_ok[:, None] & col_ok[None, :]
        h = tl.load(h_ptr + row * stride_ht + (s * rank + rs) * stride_hr, mask=r_ok, other=0.0).to(tl.float32)
        b = tl.load(b_slot + rs[:, None] * stride_br + cols[None, :] * stride_bn, mask=b_mask, other=0.0).to(tl.float32)
        acc += tl.sum(h[:, None] * b, axis=0)
    y_row = y_ptr + row * stride_yt + (offset + cols) * stride_yn
    y = tl.load(y_row, mask=col_ok).to(tl.float32)
    tl.store(y_row, (y + acc).to(y_ptr.dtype.element_ty), mask=col_ok)


def expand(
    y: torch.Tensor,
    h: torch.Tensor,
    table: torch.Tensor,
    rank: int,
    widest: int,
    tiles: torch.Tensor,
    rows: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """Add ``h @ B`` into ``y`` (``[T, sum(out_s)]``; ``h`` ``[T, slices · rank]``, any strides) for
    every slice of ``table`` (:func:`slice_table`, ``widest`` its largest width) and the tokens of
    ``tiles`` and ``rows``/``slots`` (as :func:`~kvserve_platform_cuda.lora.shrink.shrink` takes
    them); other rows of ``y`` are neither read nor written."""
    strides = (*y.stride(), *h.stride(), table.stride(0))
    block_n = block(widest, 256 if INTERPRETED else 64)
    block_r = block(rank, 64)
    if tiles.shape[0]:
        grid = (tiles.shape[0], table.shape[0], triton.cdiv(widest, block_n))
        _sgmv_expand_kernel[grid](
            y, h, table, tiles, *strides, rank,
            BLOCK_M=SEGMENT_TILE, BLOCK_N=block_n, BLOCK_R=block_r, DOT_FP32=dot_fp32(y.dtype),
        )  # fmt: skip
    if rows.shape[0]:
        grid = (rows.shape[0], table.shape[0], triton.cdiv(widest, block_n))
        _bgmv_expand_kernel[grid](y, h, table, rows, slots, *strides, rank, BLOCK_N=block_n, BLOCK_R=block_r)
