"""A plain PyTorch reference for paged attention, and a builder of random paged batches."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvserve.interfaces import AttentionBatch


@dataclass
class PagedCase:
    """A random batch: per-sequence full K/V and queries, with block tables drawn at random."""

    batch: AttentionBatch
    query: torch.Tensor  # [num_tokens, heads, d]
    key: torch.Tensor  # new tokens only, [num_tokens, kv_heads, d]
    value: torch.Tensor
    past_keys: list[torch.Tensor]  # per sequence, [context_len, kv_heads, d]
    past_values: list[torch.Tensor]


def make_paged_case(
    seqs: list[tuple[int, int]],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    num_blocks: int,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> PagedCase:
    """``seqs`` lists ``(context_len, query_len)`` per sequence; block 0 is never used (null block)."""
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-(c + q) // block_size) for c, q in seqs]
    if sum(needed) > num_blocks - 1:
        raise ValueError("not enough blocks for this case")
    free = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    tables = [[free.pop() for _ in range(n)] for n in needed]
    width = max(needed)
    block_tables = torch.zeros(len(seqs), width, dtype=torch.int32)
    for i, table in enumerate(tables):
        block_tables[i, : len(table)] = torch.tensor(table, dtype=torch.int32)
    starts, slots = [0], []
    for (context, q), table in zip(seqs, tables):
        starts.append(starts[-1] + q)
        slots += [table[p // block_size] * block_size + p % block_size for p in range(context, context + q)]
    num_tokens = starts[-1]

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    batch = AttentionBatch(
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor([c + q for c, q in seqs], dtype=torch.int32),
        context_lens=torch.tensor([c for c, _ in seqs], dtype=torch.int32),
        block_tables=block_tables,
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start_loc_host=starts,
        seq_lens_host=[c + q for c, q in seqs],
        block_size=block_size,
    )
    return PagedCase(
        batch=batch,
        query=rand(num_tokens, num_heads, head_dim),
        key=rand(num_tokens, num_kv_heads, head_dim),
        value=rand(num_tokens, num_kv_heads, head_dim),
        past_keys=[rand(c, num_kv_heads, head_dim) for c, _ in seqs],
        past_values=[rand(c, num_kv_heads, head_dim) for c, _ in seqs],
    )


def reference_attention(case: PagedCase, scale: float) -> torch.Tensor:
    """Causal attention computed per sequence and per head in float64, with explicit loops."""
    batch = case.batch
    out = torch.empty(case.query.shape, dtype=torch.float64)
    num_heads, num_kv_heads = case.query.shape[1], case.key.shape[1]
    group = num_heads // num_kv_heads
    for i in range(batch.num_seqs):
        start, end = batch.query_start_loc_host[i], batch.query_start_loc_host[i + 1]
        keys = torch.cat([case.past_keys[i], case.key[start:end]]).double()
        values = torch.cat([case.past_values[i], case.value[start:end]]).double()
        context = batch.seq_lens_host[i] - (end - start)
        for h in range(num_heads):
            q = case.query[start:end, h].double()
            scores = q @ keys[:, h // group].T * scale
            positions = torch.arange(context, context + end - start)[:, None]
            scores = scores.masked_fill(torch.arange(keys.shape[0])[None, :] > positions, float("-inf"))
            out[start:end, h] = scores.softmax(-1) @ values[:, h // group]
    return out


def write_past_kv(case: PagedCase, write_slots) -> None:
    """Place every sequence's past K/V in the cache through ``write_slots(key, value, slots)``."""
    batch = case.batch
    for i in range(batch.num_seqs):
        context = batch.seq_lens_host[i] - batch.query_lens_host[i]
        if context == 0:
            continue
        table = batch.block_tables[i].tolist()
        slots = torch.tensor(
            [table[p // batch.block_size] * batch.block_size + p % batch.block_size for p in range(context)]
        )
        write_slots(case.past_keys[i], case.past_values[i], slots)
