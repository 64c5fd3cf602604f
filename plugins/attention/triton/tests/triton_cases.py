"""Random paged batches and the float64 reference the kernel and backend tests share."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvserve.testing.attention_reference import build_batch, token_slots

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOLERANCES = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}
GARBAGE = 50.0
"""Around this value lie the cache slots no case wrote: far from any K/V drawn (standard normal)."""

MIXED = [(0, 7), (5, 1), (20, 1), (3, 9), (40, 1), (0, 1), (17, 16)]
"""``(cached tokens, new tokens)``: prefills, decodes and chunked prefills in one batch."""


@dataclass
class Case:
    """A paged batch whose cache already holds every cached and new token's K/V."""

    batch: object
    query: torch.Tensor
    keys: list[torch.Tensor]
    """Per sequence, K of all its ``seq_len`` tokens ``[seq_len, kv_heads, d]``."""
    values: list[torch.Tensor]
    cache: torch.Tensor
    """``(2, num_blocks, block_size, kv_heads, d)``."""


def make_case(seqs, heads, kv_heads, head_dim, block_size, dtype, *, seed=0, num_blocks=None, blocks=None, qkv=False):
    """A random case; blocks come from ``blocks`` (in random order) or ``1 .. num_blocks-1``.

    ``qkv``: query, key and value are views into one fused ``[tokens, (heads + 2 kv_heads) * d]``
    tensor, as a Llama layer slices its qkv projection (non-contiguous, with a row stride of all three).
    """
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-(c + q) // block_size) for c, q in seqs]
    if blocks is None:
        num_blocks = num_blocks or 2 * sum(needed) + 2
        blocks = list(range(1, num_blocks))
    num_blocks = max(num_blocks or 0, max(blocks) + 1)
    order = torch.randperm(len(blocks), generator=gen).tolist()
    free = [blocks[i] for i in order]
    tables = [[free.pop() for _ in range(n)] for n in needed]
    batch = build_batch(tables, [c for c, _ in seqs], [q for _, q in seqs], block_size, DEVICE)
    tokens = batch.num_tokens

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    if qkv:
        fused = rand(tokens, (heads + 2 * kv_heads) * head_dim)
        q_width, kv_width = heads * head_dim, kv_heads * head_dim
        query = fused[:, :q_width].view(tokens, heads, head_dim)
        new_k = fused[:, q_width : q_width + kv_width].view(tokens, kv_heads, head_dim)
        new_v = fused[:, q_width + kv_width :].view(tokens, kv_heads, head_dim)
    else:
        query, new_k, new_v = (
            rand(tokens, heads, head_dim),
            rand(tokens, kv_heads, head_dim),
            rand(tokens, kv_heads, head_dim),
        )
    cache = (GARBAGE + torch.randn(2, num_blocks, block_size, kv_heads, head_dim, generator=gen)).to(dtype)
    keys, values = [], []
    starts = batch.query_start_loc_host
    for i, (context, _) in enumerate(seqs):
        k = torch.cat([rand(context, kv_heads, head_dim), new_k[starts[i] : starts[i + 1]]])
        v = torch.cat([rand(context, kv_heads, head_dim), new_v[starts[i] : starts[i + 1]]])
        slots = token_slots(tables[i], 0, k.shape[0], block_size)
        cache[0].view(-1, kv_heads, head_dim)[slots] = k
        cache[1].view(-1, kv_heads, head_dim)[slots] = v
        keys.append(k)
        values.append(v)
    if qkv:
        fused = fused.to(DEVICE)
        query = fused[:, :q_width].view(tokens, heads, head_dim)
        assert not query.is_contiguous()
    else:
        query = query.to(DEVICE)
    return Case(batch, query, keys, values, cache.to(DEVICE))


def reference(case: Case, scale: float, window: int | None = None, soft_cap: float | None = None) -> torch.Tensor:
    """float64 attention: query at position p sees keys j <= p (and j > p - window), scores
    ``q.k * scale`` (then ``cap * tanh(score / cap)``), query head h reads KV head h // group."""
    batch = case.batch
    heads, kv_heads = case.query.shape[1], case.keys[0].shape[1]
    out = torch.zeros(case.query.shape, dtype=torch.float64)
    query = case.query.double().cpu()
    for i, (k, v) in enumerate(zip(case.keys, case.values)):
        start, end = batch.query_start_loc_host[i], batch.query_start_loc_host[i + 1]
        head_map = torch.arange(heads) // (heads // kv_heads)
        k, v = k.double()[:, head_map], v.double()[:, head_map]
        scores = torch.einsum("qhd,khd->hqk", query[start:end], k) * scale
        if soft_cap is not None:
            scores = soft_cap * torch.tanh(scores / soft_cap)
        q_pos = torch.arange(k.shape[0] - (end - start), k.shape[0])[:, None]
        k_pos = torch.arange(k.shape[0])[None, :]
        visible = k_pos <= q_pos
        if window is not None:
            visible &= k_pos > q_pos - window
        probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        out[start:end] = torch.einsum("hqk,khd->qhd", probs, v)
    return out


def check(case: Case, out: torch.Tensor, **facts):
    expected = reference(case, **{k: v for k, v in facts.items() if k in ("scale", "window", "soft_cap")})
    atol, rtol = TOLERANCES[case.query.dtype]
    assert out.dtype == case.query.dtype and out.shape == case.query.shape
    got = out.double().cpu()
    assert got.abs().max() < GARBAGE / 2, "values of never-written cache slots reached the output"
    torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)
