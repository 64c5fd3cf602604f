"""The shared inner loop: online softmax of a tile of query rows over a range of paged keys."""

import triton
import triton.language as tl


@triton.jit
def _tanh(x):
    # tl has no portable tanh (the interpreter lacks libdevice); this form never overflows.
    t = tl.exp(-2.0 * tl.abs(x))
    y = (1.0 - t) / (1.0 + t)
    return tl.where(x < 0, -y, y)


@triton.jit
def _dot(a, b, DOT_FP32: tl.constexpr, PRECISION: tl.constexpr):
    if DOT_FP32:  # the interpreter computes low-precision tl.dot wrongly
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def attend_key_range(
    acc,
    m_i,
    l_i,
    q,
    query_pos,
    row_valid,
    key_lo,
    key_hi,
    seq_len,
    k_cache_ptr,
    v_cache_ptr,
    table_ptr,
    kv_head,
    block_size,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_vd,
    scale,
    window,
    softcap,
    head_dim,
    HEAD_PAD: tl.constexpr,
    TILE_N: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    DOT_FP32: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Fold keys ``key_lo .. key_hi`` (``key_lo`` a multiple of TILE_N) into the running
    ``acc`` ``[M, HEAD_PAD]``, row maxima ``m_i`` and row sums ``l_i`` (float32).

    A key ``j`` is seen by row ``r`` when ``j < seq_len``, ``j <= query_pos[r]`` and, with a
    window, ``j > query_pos[r] - window``; its physical slot comes from the block table.
    Rows that see nothing keep ``m = -inf`` and ``l = 0``.
    """
    offs_d = tl.arange(0, HEAD_PAD)
    d_mask = offs_d < head_dim
    for start in range(key_lo, key_hi, TILE_N):
        offs_n = start + tl.arange(0, TILE_N)
        key_valid = offs_n < key_hi
        block = tl.load(table_ptr + offs_n // block_size, mask=key_valid, other=0).to(tl.int64)
        offset = (offs_n % block_size).to(tl.int64)
        kv_mask = key_valid[:, None] & d_mask[None, :]
        k = tl.load(
            k_cache_ptr
            + block[:, None] * stride_kb
            + offset[:, None] * stride_ks
            + kv_head * stride_kh
            + offs_d[None, :] * stride_kd,
            mask=kv_mask,
            other=0.0,
        )
        v = tl.load(
            v_cache_ptr
            + block[:, None] * stride_vb
            + offset[:, None] * stride_vs
            + kv_head * stride_vh
            + offs_d[None, :] * stride_vd,
            mask=kv_mask,
            other=0.0,
        )
        s = _dot(q, tl.trans(k.to(q.dtype)), DOT_FP32, PRECISION) * scale
        if HAS_SOFTCAP:
            s = softcap * _tanh(s / softcap)
        visible = row_valid[:, None] & (key_valid & (offs_n < seq_len))[None, :]
        visible = visible & (offs_n[None, :] <= query_pos[:, None])
        if HAS_WINDOW:
            visible = visible & (offs_n[None, :] > query_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that saw nothing yet
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _dot(p.to(q.dtype), v.to(q.dtype), DOT_FP32, PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def load_query_tile(
    query_ptr,
    query_start_ptr,
    seq_lens_ptr,
    seq,
    tile_start,
    kv_head,
    stride_qt,
    stride_qh,
    stride_qd,
    head_dim,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    QUERIES_PER_KV: tl.constexpr,
    HEAD_PAD: tl.constexpr,
):
    """The ``[BLOCK_M, HEAD_PAD]`` queries of a tile (row ``r``: token ``r // QUERIES_PER_KV``,
    head ``kv_head * QUERIES_PER_KV + r % QUERIES_PER_KV``), with each row's token index,
    head, position and validity, and the sequence's length."""
    q_begin = tl.load(query_start_ptr + seq)
    query_len = tl.load(query_start_ptr + seq + 1) - q_begin
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - query_len
    rows = tl.arange(0, BLOCK_M)
    q_in_seq = tile_start + rows // QUERIES_PER_KV
    head = kv_head * QUERIES_PER_KV + rows % QUERIES_PER_KV
    row_valid = (rows < BLOCK_Q * QUERIES_PER_KV) & (q_in_seq < query_len)
    token = (q_begin + q_in_seq).to(tl.int64)
    offs_d = tl.arange(0, HEAD_PAD)
    q = tl.load(
        query_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :] * stride_qd,
        mask=row_valid[:, None] & (offs_d < head_dim)[None, :],
        other=0.0,
    )
    return q, token, head, context_len + q_in_seq, row_valid, seq_len, context_len, query_len


@triton.jit
def key_bounds(context_len, query_len, tile_start, seq_len, window, BLOCK_Q: tl.constexpr, TILE_N: tl.constexpr,
               HAS_WINDOW: tl.constexpr):  # fmt: skip
    """``[lo, hi)``: the keys any query of the tile may see (``lo`` rounded down to a tile)."""
    last = context_len + tl.minimum(tile_start + BLOCK_Q, query_len) - 1
    hi = tl.minimum(seq_len, last + 1)
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(context_len + tile_start - window + 1, 0)
        lo = (lo // TILE_N) * TILE_N
    return lo, hi
