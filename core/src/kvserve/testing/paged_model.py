"""Run a model over the paged KV cache the way the engine's runner does, for model tests."""

from __future__ import annotations

import torch

from kvserve.forward_context import ForwardContext
from kvserve.interfaces import AttentionBackend, AttentionSpec
from kvserve.layers import attention_layers
from kvserve.testing.attention_reference import ReferenceAttentionBackend, build_batch


class PagedSequences:
    """Feeds token chunks of several sequences through a model, one engine step per :meth:`step`.

    Blocks are drawn from a random permutation (block 0 stays the null block), so a model
    or backend that ignored the block tables would read the wrong keys. ``backend`` is the
    attention backend class (default: the float64 :class:`ReferenceAttentionBackend`, so a
    model test depends on no attention plugin); ``dtype`` the KV cache and query dtype.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        num_seqs: int,
        block_size: int = 4,
        num_blocks: int = 48,
        backend: type[AttentionBackend] = ReferenceAttentionBackend,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        _, num_heads, num_kv_heads, head_dim = model.attention_shape()
        self.device = torch.device(device)
        layers = attention_layers(model)
        spec = AttentionSpec(num_heads, num_kv_heads, head_dim, dtype, block_size, self.device, layers)
        self.model = model
        self.backend = backend(spec)
        self.kv_caches = self.backend.allocate_kv_cache(num_blocks)
        self.block_size = block_size
        self.free_blocks = (torch.randperm(num_blocks - 1, generator=torch.Generator().manual_seed(0)) + 1).tolist()
        self.tables: list[list[int]] = [[] for _ in range(num_seqs)]
        self.lengths = [0] * num_seqs

    @torch.inference_mode()
    def step(self, chunks: dict[int, list[int]]) -> dict[int, torch.Tensor]:
        """Append ``chunks[seq]`` to each listed sequence in one forward; logits of every new token."""
        input_ids, positions = [], []
        for seq, tokens in chunks.items():
            start, end = self.lengths[seq], self.lengths[seq] + len(tokens)
            table = self.tables[seq]
            while len(table) * self.block_size < end:
                if not self.free_blocks:
                    raise ValueError("PagedSequences ran out of KV blocks: pass a larger num_blocks")
                table.append(self.free_blocks.pop())
            input_ids += tokens
            positions += range(start, end)
        batch = build_batch(
            [self.tables[seq] for seq in chunks],
            [self.lengths[seq] for seq in chunks],
            [len(tokens) for tokens in chunks.values()],
            self.block_size,
            self.device,
        )
        for seq, tokens in chunks.items():
            self.lengths[seq] += len(tokens)
        ctx = ForwardContext(self.backend, batch, self.backend.build_metadata(batch), self.kv_caches)
        hidden = self.model(
            torch.tensor(input_ids, device=self.device), torch.tensor(positions, device=self.device), ctx
        )
        logits = self.model.compute_logits(hidden)
        assert logits.dtype == torch.float32, f"compute_logits must return float32 logits, got {logits.dtype}"
        starts = batch.query_start_loc_host
        return {seq: logits[starts[row] : starts[row + 1]] for row, seq in enumerate(chunks)}
