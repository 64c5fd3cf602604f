"""Per-step arguments of the FlashAttention 2 calls, built on the host and copied to the device once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from kvserve.interfaces import AttentionBatch


@dataclass(frozen=True)
class VarlenArrays:
    """Host int32 arrays in flash-attn's varlen convention (sequence ``i`` owns query rows
    ``cu_seqlens_q[i]:cu_seqlens_q[i+1]`` and the first ``cu_seqlens_k[i+1] - cu_seqlens_k[i]``
    keys reachable through its block-table row)."""

    cu_seqlens_q: np.ndarray
    """``[num_seqs + 1]``: prefix sums of the new-token counts (``query_start_loc``)."""
    cu_seqlens_k: np.ndarray
    """``[num_seqs + 1]``: prefix sums of the key counts (cached + new tokens)."""
    seqused_k: np.ndarray
    """``[num_seqs]``: keys per sequence (``flash_attn_with_kvcache``'s ``cache_seqlens``)."""
    max_seqlen_q: int
    max_seqlen_k: int
    decode_only: bool
    """Every sequence adds exactly one token: the step can use ``flash_attn_with_kvcache``."""


def varlen_arrays(query_start_loc: Sequence[int], seq_lens: Sequence[int]) -> VarlenArrays:
    """The varlen arrays of a step from the batch's host lists (no device tensor is read)."""
    cu_q = np.asarray(query_start_loc, dtype=np.int32)
    seqused_k = np.asarray(seq_lens, dtype=np.int32)
    cu_k = np.zeros(len(seqused_k) + 1, dtype=np.int32)
    np.cumsum(seqused_k, out=cu_k[1:])
    query_lens = np.diff(cu_q)
    return VarlenArrays(
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
        seqused_k=seqused_k,
        max_seqlen_q=int(query_lens.max(initial=0)),
        max_seqlen_k=int(seqused_k.max(initial=0)),
        decode_only=len(query_lens) > 0 and bool((query_lens == 1).all()),
    )


def window_size(sliding_window: int | None) -> tuple[int, int]:
    """flash-attn's ``window_size=(left, right)`` for a layer's ``sliding_window``: a query at
    position ``p`` sees keys ``p - left .. p + right``, so a window of ``w`` keys (its own
    included) is ``(w - 1, 0)``; -1 means unbounded."""
    return (-1, -1) if sliding_window is None else (sliding_window - 1, 0)


@dataclass(frozen=True)
class FlashAttnMetadata:
    """What every layer's ``write_kv``/``forward`` of one step shares (tensors on the engine device)."""

    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    seqused_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    decode_only: bool
    num_seqs: int
    block_table: torch.Tensor
    """int32 ``[num_seqs, max_blocks]``: the batch's block tables."""
    slot_mapping: torch.Tensor


def build_metadata(batch: AttentionBatch, device: torch.device) -> FlashAttnMetadata:
    """Plan a step: the varlen arrays from the host lists, sent to ``device`` in one copy."""
    arrays = varlen_arrays(batch.query_start_loc_host, batch.seq_lens_host)
    packed = torch.from_numpy(np.concatenate([arrays.cu_seqlens_q, arrays.cu_seqlens_k, arrays.seqused_k]))
    if device.type == "cuda":
        packed = packed.pin_memory()  # lets the copy below run asynchronously
    cu_q, cu_k, seqused_k = packed.to(device, non_blocking=True).split([batch.num_seqs + 1] * 2 + [batch.num_seqs])
    return FlashAttnMetadata(
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
        seqused_k=seqused_k,
        max_seqlen_q=arrays.max_seqlen_q,
        max_seqlen_k=arrays.max_seqlen_k,
        decode_only=arrays.decode_only,
        num_seqs=batch.num_seqs,
        block_table=batch.block_tables,
        slot_mapping=batch.slot_mapping,
    )
