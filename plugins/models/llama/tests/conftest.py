"""A driver that runs a model over the paged KV cache as the engine's runner does, for model tests."""

from __future__ import annotations

import pytest
import torch

from kvserve.forward_context import ForwardContext
from kvserve.interfaces import AttentionBatch, AttentionSpec
from kvserve_attention_cpu.backend import CpuAttentionBackend


class PagedSequences:
    """Feeds token chunks of several sequences through a model the way the engine's runner does.

    Blocks are drawn from a random permutation (block 0 stays the null block), so a model
    or backend that ignored the block tables would read the wrong keys.
    """

    def __init__(self, model: torch.nn.Module, num_seqs: int, block_size: int = 4, num_blocks: int = 48):
        num_layers, num_heads, num_kv_heads, head_dim = model.attention_shape()
        spec = AttentionSpec(num_heads, num_kv_heads, head_dim, torch.float32, block_size, torch.device("cpu"))
        self.model = model
        self.backend = CpuAttentionBackend(spec)
        shape = CpuAttentionBackend.kv_cache_shape(num_blocks, block_size, num_kv_heads, head_dim)
        self.kv_caches = [torch.zeros(shape) for _ in range(num_layers)]
        self.block_size = block_size
        self.free_blocks = (torch.randperm(num_blocks - 1, generator=torch.Generator().manual_seed(0)) + 1).tolist()
        self.tables: list[list[int]] = [[] for _ in range(num_seqs)]
        self.lengths = [0] * num_seqs

    @torch.inference_mode()
    def step(self, chunks: dict[int, list[int]]) -> dict[int, torch.Tensor]:
        """Append ``chunks[seq]`` to each listed sequence in one forward; logits of every new token."""
        bs = self.block_size
        input_ids, positions, slots, starts, seq_lens = [], [], [], [0], []
        for seq, tokens in chunks.items():
            start, end = self.lengths[seq], self.lengths[seq] + len(tokens)
            table = self.tables[seq]
            while len(table) * bs < end:
                table.append(self.free_blocks.pop())
            input_ids += tokens
            positions += range(start, end)
            slots += [table[p // bs] * bs + p % bs for p in range(start, end)]
            starts.append(starts[-1] + len(tokens))
            seq_lens.append(end)
            self.lengths[seq] = end
        width = max(len(self.tables[seq]) for seq in chunks)
        block_tables = torch.zeros(len(chunks), width, dtype=torch.int32)
        for row, seq in enumerate(chunks):
            block_tables[row, : len(self.tables[seq])] = torch.tensor(self.tables[seq])
        batch = AttentionBatch(
            query_start_loc=torch.tensor(starts, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            context_lens=torch.tensor([n - len(t) for n, t in zip(seq_lens, chunks.values())], dtype=torch.int32),
            block_tables=block_tables,
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            query_start_loc_host=starts,
            seq_lens_host=seq_lens,
            block_size=bs,
        )
        ctx = ForwardContext(self.backend, batch, self.backend.build_metadata(batch), self.kv_caches)
        hidden = self.model(torch.tensor(input_ids), torch.tensor(positions), ctx)
        logits = self.model.compute_logits(hidden)
        assert logits.dtype == torch.float32
        return {seq: logits[starts[row] : starts[row + 1]] for row, seq in enumerate(chunks)}


@pytest.fixture
def paged_sequences() -> type[PagedSequences]:
    """The :class:`PagedSequences` class (test modules cannot import conftest under importlib mode)."""
    return PagedSequences
