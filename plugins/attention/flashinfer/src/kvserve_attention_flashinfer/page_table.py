"""FlashInfer's CSR page tables of one step, built from the host block tables (no device sync)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PageTables:
    """Host int32 arrays in FlashInfer's paged-KV CSR layout.

    Request ``i`` owns query rows ``qo_indptr[i]:qo_indptr[i+1]`` and the pages
    ``paged_kv_indices[paged_kv_indptr[i]:paged_kv_indptr[i+1]]``, in order; all of them are full
    except the last, which holds ``paged_kv_last_page_len[i]`` (1 .. page_size) tokens.
    """

    qo_indptr: np.ndarray
    paged_kv_indptr: np.ndarray
    paged_kv_indices: np.ndarray
    paged_kv_last_page_len: np.ndarray
    decode_only: bool
    """Every request adds one token: the step can use the decode wrapper."""

    @property
    def num_tokens(self) -> int:
        return int(self.qo_indptr[-1])

    @property
    def num_seqs(self) -> int:
        return len(self.paged_kv_last_page_len)


def page_tables(
    query_start_loc: Sequence[int], seq_lens: Sequence[int], block_tables: np.ndarray, page_size: int
) -> PageTables:
    """The CSR tables of a step: sequence ``i`` of ``seq_lens[i]`` tokens uses the first
    ``ceil(seq_lens[i] / page_size)`` entries of ``block_tables[i]``."""
    qo_indptr = np.asarray(query_start_loc, dtype=np.int32)
    lens = np.asarray(seq_lens, dtype=np.int32)
    num_pages = (lens + page_size - 1) // page_size
    if len(lens) and num_pages.max() > block_tables.shape[1]:
        raise ValueError(f"block tables have {block_tables.shape[1]} columns; a sequence needs {num_pages.max()}")
    indptr = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(num_pages, out=indptr[1:])
    used = np.arange(block_tables.shape[1])[None, :] < num_pages[:, None]
    query_lens = np.diff(qo_indptr)
    return PageTables(
        qo_indptr=qo_indptr,
        paged_kv_indptr=indptr,
        # boolean indexing walks rows in order: each request's pages, in table order
        paged_kv_indices=np.ascontiguousarray(block_tables[used], dtype=np.int32),
        paged_kv_last_page_len=(lens - (num_pages - 1) * page_size).astype(np.int32),
        decode_only=len(query_lens) > 0 and bool((query_lens == 1).all()),
    )
