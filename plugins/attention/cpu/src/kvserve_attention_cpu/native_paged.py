"""Which sequences of a step the C++ kernel (``paged_attention.cpp``) attends, and the call itself.

The kernel reads K/V in place through the block tables (no gather, no padding to the longest
sequence) and costs about the same per (query row, visible key) pair at any shape; SDPA's flash
kernel over a gathered sequence has a fixed cost per call (~50 us here) but runs the pairs about
twice as fast. So decodes and small prefill chunks take the kernel and a chunk with more than
:data:`KERNEL_MAX_PAIRS` pairs takes SDPA (measured per layer, SmolLM2's 9/3 heads of 64, bf16, one
thread: 16 fresh prompts of 16 tokens 0.28 ms kernel vs 0.83 ms SDPA; 8 of 32 tokens 0.48 vs 0.62;
8 of 64 tokens 1.84 vs 1.55; 32 chunks of 8 after 200 cached 5.7 vs 3.9; 512 after 2,488 cached 155 vs 46).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvserve.interfaces import AttentionBatch, LayerAttentionSpec

KERNEL_MAX_PAIRS = 1024
"""A prefill chunk whose query rows see more (row, key) pairs than this goes to SDPA."""


@dataclass
class NativePagedMetadata:
    batch: AttentionBatch
    block_tables: torch.Tensor
    """int32 ``[num_seqs, max_blocks]``, contiguous (what the kernel reads)."""
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    kernel_seqs: torch.Tensor | None
    """int32 ids of the sequences the kernel attends; None: none."""
    sdpa_seqs: list[int]
    """Sequences attended by SDPA over their gathered K/V instead."""
    prefill_masks: dict[tuple[int, LayerAttentionSpec], torch.Tensor | None]
    """Per (SDPA sequence, layer kind): what the base class's ``_prefill_mask`` gives."""
    write_index: torch.Tensor | None
    """Tokens that have a cache slot (slot -1 is padding); None: every token."""


def split_sequences(batch: AttentionBatch, window: int | None) -> tuple[list[int], list[int]]:
    """``(kernel sequences, SDPA sequences)`` of ``batch``; ``window``: the widest sliding window of
    the model's layers (None: some layer has none), which bounds the keys a row sees."""
    kernel, sdpa = [], []
    for i, (q_len, seq_len) in enumerate(zip(batch.query_lens_host, batch.seq_lens_host)):
        if q_len == 0:
            continue
        pairs = q_len * (seq_len - q_len + (q_len + 1) / 2)  # context keys, then causal within the chunk
        if window is not None:
            pairs = min(pairs, q_len * window)
        (kernel if q_len == 1 or pairs <= KERNEL_MAX_PAIRS else sdpa).append(i)
    return kernel, sdpa


def attend(out: torch.Tensor, query: torch.Tensor, kv_cache: torch.Tensor, metadata: NativePagedMetadata, layer):
    """The kernel's attention of ``metadata.kernel_seqs`` into their rows of ``out``."""
    torch.ops.kvserve_attention_cpu.paged_attention_out(
        out,
        query,
        kv_cache,
        metadata.block_tables,
        metadata.seq_lens,
        metadata.query_start_loc,
        metadata.kernel_seqs,
        layer.scale,
        layer.sliding_window or 0,
        layer.logits_soft_cap or 0.0,
    )
