"""Unified paged attention: one kernel for a mixed batch of prefills, chunked prefills and decodes.

Each program takes one query tile (``QueryBlocks``) and one KV head, walks the keys its
queries may see through the sequence's block table, and keeps an online softmax in float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvserve_attention_triton.kernels.common import INTERPRETED, cache_strides, dot_precision, head_pad, key_tile
from kvserve_attention_triton.kernels.plan import QueryBlocks
from kvserve_attention_triton.kernels.tiles import attend_key_range, key_bounds, load_query_tile


@triton.jit
def _unified_attention_kernel(
    out_ptr, query_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, query_start_ptr, seq_lens_ptr,
    tile_seq_ptr, tile_start_ptr,
    stride_ot, stride_oh, stride_od, stride_qt, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd, stride_vb, stride_vs, stride_vh, stride_vd, stride_bt,
    block_size, head_dim, scale, window, softcap,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, QUERIES_PER_KV: tl.constexpr, HEAD_PAD: tl.constexpr,
    TILE_N: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    DOT_FP32: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.load(tile_seq_ptr + tile)
    tile_start = tl.load(tile_start_ptr + tile)
    q, token, head, query_pos, row_valid, seq_len, context_len, query_len = load_query_tile(
        query_ptr, query_start_ptr, seq_lens_ptr, seq, tile_start, kv_head, stride_qt, stride_qh, stride_qd,
        head_dim, BLOCK_M, BLOCK_Q, QUERIES_PER_KV, HEAD_PAD,
    )  # fmt: skip
    lo, hi = key_bounds(context_len, query_len, tile_start, seq_len, window, BLOCK_Q, TILE_N, HAS_WINDOW)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc, m_i, l_i = attend_key_range(
        acc, m_i, l_i, q, query_pos, row_valid, lo, hi, seq_len, k_cache_ptr, v_cache_ptr,
        block_tables_ptr + seq.to(tl.int64) * stride_bt, kv_head, block_size,
        stride_kb, stride_ks, stride_kh, stride_kd, stride_vb, stride_vs, stride_vh, stride_vd,
        scale, window, softcap, head_dim, HEAD_PAD, TILE_N, HAS_WINDOW, HAS_SOFTCAP, DOT_FP32, PRECISION,
    )  # fmt: skip
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    offs_d = tl.arange(0, HEAD_PAD)
    tl.store(
        out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :] * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=row_valid[:, None] & (offs_d < head_dim)[None, :],
    )


def unified_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    tiles: QueryBlocks,
    *,
    scale: float,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of ``query`` ``[num_tokens, num_heads, head_dim]`` (any strides) over the
    paged ``key_cache``/``value_cache`` ``[num_blocks, block_size, num_kv_heads, head_dim]``.

    Sequence ``i`` owns tokens ``query_start_loc[i]:query_start_loc[i+1]``, which sit at its
    last positions before ``seq_lens[i]``; its keys are found through ``block_tables[i]``.
    ``tiles`` comes from :func:`~kvserve_attention_triton.kernels.plan.plan_query_blocks`.
    Returns ``out`` (``[num_tokens, num_heads, head_dim]`` in the query's dtype).
    """
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads, block_size = key_cache.shape[2], key_cache.shape[1]
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if tiles.count == 0:
        return out
    grid = (tiles.count, num_kv_heads)
    _unified_attention_kernel[grid](
        out, query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, tiles.seq, tiles.start,
        *out.stride(), *query.stride(), *cache_strides(key_cache), *cache_strides(value_cache), block_tables.stride(0),
        block_size, head_dim, scale, sliding_window or 0, logits_soft_cap or 0.0,
        BLOCK_M=tiles.block_m, BLOCK_Q=tiles.block_q, QUERIES_PER_KV=num_heads // num_kv_heads,
        HEAD_PAD=head_pad(head_dim), TILE_N=key_tile(head_dim, query.dtype),
        HAS_WINDOW=sliding_window is not None, HAS_SOFTCAP=logits_soft_cap is not None,
        DOT_FP32=INTERPRETED, PRECISION=dot_precision(query.dtype),
    )  # fmt: skip
    return out
