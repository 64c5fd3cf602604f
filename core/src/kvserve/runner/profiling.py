"""The profiling forward the engine runs before it sizes the KV cache: the largest step the
scheduler can plan, on a throwaway cache, measured by the platform."""

from __future__ import annotations

import numpy as np
import torch

from kvserve.forward_context import ForwardContext, current_forward_context
from kvserve.interfaces import AttentionBackend, AttentionBatch, Platform


def profile_batch(num_tokens: int, max_seq_len: int, max_num_seqs: int, block_size: int, device: torch.device):
    """A batch of ``num_tokens`` new tokens, each sequence's chunk ending at ``max_seq_len``.

    Chunks of at most ``max_seq_len`` tokens over at most ``max_num_seqs`` sequences; every
    chunk attends to a full-length context, the costliest way to spend the token budget.
    Returns ``(input_ids, positions, batch, num_blocks)``, ``num_blocks`` including the null block.
    """
    query_lens = []
    remaining = min(num_tokens, max_num_seqs * max_seq_len)
    while remaining > 0:
        query_lens.append(min(remaining, max_seq_len))
        remaining -= query_lens[-1]
    blocks_per_seq = -(-max_seq_len // block_size)
    tables = np.arange(1, 1 + len(query_lens) * blocks_per_seq, dtype=np.int32).reshape(len(query_lens), -1)
    positions = np.concatenate([np.arange(max_seq_len - n, max_seq_len) for n in query_lens])
    slots = np.concatenate(
        [table[pos // block_size].astype(np.int64) * block_size + pos % block_size
         for table, pos in zip(tables, np.split(positions, np.cumsum(query_lens)[:-1]))]
    )  # fmt: skip
    starts = [0, *np.cumsum(query_lens).tolist()]
    seq_lens = [max_seq_len] * len(query_lens)
    context_lens = [max_seq_len - n for n in query_lens]

    def to_device(array, dtype):
        return torch.as_tensor(array, dtype=dtype).to(device)

    batch = AttentionBatch(
        query_start_loc=to_device(starts, torch.int32),
        seq_lens=to_device(seq_lens, torch.int32),
        context_lens=to_device(context_lens, torch.int32),
        block_tables=to_device(tables, torch.int32),
        slot_mapping=to_device(slots, torch.int64),
        query_start_loc_host=starts,
        seq_lens_host=seq_lens,
        context_lens_host=context_lens,
        block_tables_host=tables,
        block_size=block_size,
    )
    input_ids = torch.zeros(len(positions), dtype=torch.long, device=device)
    return input_ids, to_device(positions, torch.long), batch, tables.size + 1


def profile_peak_memory(
    model: torch.nn.Module,
    backend: AttentionBackend,
    platform: Platform,
    num_tokens: int,
    max_seq_len: int,
    max_num_seqs: int,
) -> int:
    """Bytes of peak activation memory, as ``platform`` measures it, of one forward (logits of
    every sequence's last token included) over :func:`profile_batch`.

    The throwaway KV cache is allocated before the measurement and freed after it.
    """
    device = backend.spec.device
    input_ids, positions, batch, num_blocks = profile_batch(
        num_tokens, max_seq_len, max_num_seqs, backend.spec.block_size, device
    )
    kv_caches = backend.allocate_kv_cache(num_blocks)
    last_tokens = torch.tensor(batch.query_start_loc_host[1:], dtype=torch.long, device=device) - 1

    @torch.inference_mode()
    def forward() -> None:
        ctx = ForwardContext(backend, batch, backend.build_metadata(batch), kv_caches)
        with current_forward_context(ctx):
            hidden = model(input_ids, positions, ctx)
        model.compute_logits(hidden[last_tokens])
        platform.synchronize()

    peak = platform.profile_peak_memory(forward)
    kv_caches.clear()  # free the throwaway cache before the platform counts free memory
    return peak
