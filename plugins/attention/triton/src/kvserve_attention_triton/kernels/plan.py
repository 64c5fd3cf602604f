"""Host-side planning of the attention grid: which query tokens each program handles.

A program owns one KV head and ``block_q`` consecutive query tokens of one sequence; its
``block_m = block_q * queries_per_kv`` rows are those tokens times the query heads sharing
that KV head (GQA packs the group into the rows of one matrix multiply). The plan is made
from the host copies of the batch once per step and copied to the device once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton


@dataclass(frozen=True)
class QueryBlocks:
    """The query tiles of one step: program ``p`` handles tokens ``start[p] ..`` of sequence ``seq[p]``."""

    seq: torch.Tensor
    """int32 ``[count]`` on the device: the sequence of each tile."""
    start: torch.Tensor
    """int32 ``[count]`` on the device: the tile's first query token, counted within its sequence."""
    count: int
    block_m: int
    """Rows of one tile: a power of two >= 16 (the smallest ``tl.dot`` operand)."""
    block_q: int
    """Query tokens of one tile: ``block_m // queries_per_kv``."""


def plan_query_blocks(
    query_lens: list[int], queries_per_kv: int, device: torch.device, max_block_m: int = 64
) -> QueryBlocks:
    """Tile every sequence's ``query_lens[i]`` new tokens; decodes get one token per tile.

    ``max_block_m`` bounds the rows when prefills are long (more rows: fewer programs, more
    registers); the tile never has fewer rows than one query's whole head group.
    """
    longest = max(query_lens, default=1)
    wanted = triton.next_power_of_2(max(1, longest) * queries_per_kv)
    block_m = max(16, triton.next_power_of_2(queries_per_kv), min(wanted, max_block_m))
    block_q = block_m // queries_per_kv
    seqs, starts = [], []
    for i, n in enumerate(query_lens):
        for start in range(0, n, block_q):
            seqs.append(i)
            starts.append(start)
    table = torch.tensor([seqs, starts], dtype=torch.int32).to(device)
    return QueryBlocks(table[0], table[1], len(seqs), block_m, block_q)
