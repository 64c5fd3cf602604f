"""Split-KV (flash-decoding) attention: long sequences' keys are cut into segments that run
in parallel, each leaving a partial softmax; a second kernel merges the segments.

It pays when few programs would otherwise walk long key ranges alone (a handful of long
decodes leaves most of a GPU idle in the unified kernel).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvserve_attention_triton.kernels.common import INTERPRETED, cache_strides, dot_precision, head_pad, key_tile
from kvserve_attention_triton.kernels.plan import QueryBlocks
from kvserve_attention_triton.kernels.tiles import attend_key_range, key_bounds, load_query_tile


@triton.jit
def _split_kv_kernel(
    part_out_ptr, part_max_ptr, part_sum_ptr, query_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr,
    query_start_ptr, seq_lens_ptr, tile_seq_ptr, tile_start_ptr,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd, stride_vb, stride_vs, stride_vh, stride_vd, stride_bt,
    num_heads, num_segments, segment_len, block_size, head_dim, scale, window, softcap,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, QUERIES_PER_KV: tl.constexpr, HEAD_PAD: tl.constexpr,
    TILE_N: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    DOT_FP32: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    segment = tl.program_id(2)
    seq = tl.load(tile_seq_ptr + tile)
    tile_start = tl.load(tile_start_ptr + tile)
    q, token, head, query_pos, row_valid, seq_len, context_len, query_len = load_query_tile(
        query_ptr, query_start_ptr, seq_lens_ptr, seq, tile_start, kv_head, stride_qt, stride_qh, stride_qd,
        head_dim, BLOCK_M, BLOCK_Q, QUERIES_PER_KV, HEAD_PAD,
    )  # fmt: skip
    lo, hi = key_bounds(context_len, query_len, tile_start, seq_len, window, BLOCK_Q, TILE_N, HAS_WINDOW)
    # segment_len is a multiple of TILE_N, so the segment's first key stays tile-aligned
    lo = tl.maximum(lo, segment * segment_len)
    hi = tl.minimum(hi, (segment + 1) * segment_len)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc, m_i, l_i = attend_key_range(
        acc, m_i, l_i, q, query_pos, row_valid, lo, hi, seq_len, k_cache_ptr, v_cache_ptr,
        block_tables_ptr + seq.to(tl.int64) * stride_bt, kv_head, block_size,
        stride_kb, stride_ks, stride_kh, stride_kd, stride_vb, stride_vs, stride_vh, stride_vd,
        scale, window, softcap, head_dim, HEAD_PAD, TILE_N, HAS_WINDOW, HAS_SOFTCAP, DOT_FP32, PRECISION,
    )  # fmt: skip
    # partials are [num_tokens, num_heads, num_segments] (x HEAD_PAD for the outputs)
    row = (token * num_heads + head) * num_segments + segment
    tl.store(part_max_ptr + row, m_i, mask=row_valid)
    tl.store(part_sum_ptr + row, l_i, mask=row_valid)
    offs_d = tl.arange(0, HEAD_PAD)
    tl.store(part_out_ptr + row[:, None] * HEAD_PAD + offs_d[None, :], acc, mask=row_valid[:, None])


@triton.jit
def _merge_segments_kernel(
    out_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, stride_ot, stride_oh, stride_od,
    num_heads, num_segments, head_dim,
    SEGMENTS_PAD: tl.constexpr, HEAD_PAD: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, SEGMENTS_PAD)
    s_mask = offs_s < num_segments
    rows = (token * num_heads + head) * num_segments + offs_s
    seg_max = tl.load(part_max_ptr + rows, mask=s_mask, other=float("-inf"))
    seg_sum = tl.load(part_sum_ptr + rows, mask=s_mask, other=0.0)
    overall = tl.max(seg_max, 0)
    overall = tl.where(overall == float("-inf"), 0.0, overall)
    weight = tl.where(s_mask, tl.exp(seg_max - overall), 0.0)
    total = tl.sum(seg_sum * weight, 0)
    offs_d = tl.arange(0, HEAD_PAD)
    parts = tl.load(part_out_ptr + rows[:, None] * HEAD_PAD + offs_d[None, :], mask=s_mask[:, None], other=0.0)
    out = tl.sum(parts * weight[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(
        out_ptr + token * stride_ot + head * stride_oh + offs_d * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=offs_d < head_dim,
    )


def split_kv_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    tiles: QueryBlocks,
    *,
    max_seq_len: int,
    num_segments: int,
    scale: float,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The same result as :func:`~kvserve_attention_triton.kernels.unified_attention.unified_attention`
    (same arguments), computed with every sequence's keys ``0 .. max_seq_len-1`` cut into
    ``num_segments`` segments that run in parallel and are merged by a second kernel.

    Uses float32 partials of ``num_tokens * num_heads * num_segments * head_pad(head_dim)`` elements.
    """
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads, block_size = key_cache.shape[2], key_cache.shape[1]
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if tiles.count == 0:
        return out
    pad, tile_n = head_pad(head_dim), key_tile(head_dim, query.dtype)
    segment_len = triton.cdiv(triton.cdiv(max(max_seq_len, 1), num_segments), tile_n) * tile_n
    device = query.device
    part_out = torch.empty(num_tokens, num_heads, num_segments, pad, dtype=torch.float32, device=device)
    part_max = torch.empty(num_tokens, num_heads, num_segments, dtype=torch.float32, device=device)
    part_sum = torch.empty(num_tokens, num_heads, num_segments, dtype=torch.float32, device=device)
    _split_kv_kernel[(tiles.count, num_kv_heads, num_segments)](
        part_out, part_max, part_sum, query, key_cache, value_cache, block_tables, query_start_loc, seq_lens,
        tiles.seq, tiles.start, *query.stride(), *cache_strides(key_cache), *cache_strides(value_cache),
        block_tables.stride(0), num_heads, num_segments, segment_len, block_size, head_dim, scale,
        sliding_window or 0, logits_soft_cap or 0.0,
        BLOCK_M=tiles.block_m, BLOCK_Q=tiles.block_q, QUERIES_PER_KV=num_heads // num_kv_heads, HEAD_PAD=pad,
        TILE_N=tile_n, HAS_WINDOW=sliding_window is not None, HAS_SOFTCAP=logits_soft_cap is not None,
        DOT_FP32=INTERPRETED, PRECISION=dot_precision(query.dtype),
    )  # fmt: skip
    _merge_segments_kernel[(num_tokens, num_heads)](
        out, part_out, part_max, part_sum, *out.stride(), num_heads, num_segments, head_dim,
        SEGMENTS_PAD=triton.next_power_of_2(num_segments), HEAD_PAD=pad,
    )  # fmt: skip
    return out
