"""Plain PyTorch paged attention: the reference math, random paged batches, and a reference backend.

Everything here favours being obviously right over being fast: attention is computed in
float64 from explicit positions, and K/V are gathered token by token through block tables.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from kvserve.interfaces import AttentionBackend, AttentionBatch, LayerAttentionSpec
from kvserve.layers.kv_store import store_kv


@contextmanager
def single_thread() -> Iterator[None]:
    """Run tiny tensor ops on one thread: with several, OpenMP's hand-offs dominate and, on a
    loaded machine, make each op milliseconds slow."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def token_slots(block_table: Sequence[int] | torch.Tensor, start: int, end: int, block_size: int) -> torch.Tensor:
    """int64 cache slots of positions ``start .. end-1``: ``table[p // block_size] * block_size + p % block_size``."""
    table = torch.as_tensor(block_table, dtype=torch.int64).cpu()
    positions = torch.arange(start, end)
    return table[positions // block_size] * block_size + positions % block_size


def build_batch(
    block_tables: Sequence[Sequence[int]],
    context_lens: Sequence[int],
    query_lens: Sequence[int],
    block_size: int,
    device: torch.device | str = "cpu",
) -> AttentionBatch:
    """The :class:`AttentionBatch` of sequences that each add ``query_lens[i]`` tokens after
    ``context_lens[i]`` cached ones; short tables are padded with the null block 0."""
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    seq_lens = [c + q for c, q in zip(context_lens, query_lens)]
    width = max((len(t) for t in block_tables), default=0)
    tables = torch.zeros(len(block_tables), max(width, 1), dtype=torch.int32)
    for row, table in enumerate(block_tables):
        tables[row, : len(table)] = torch.as_tensor(list(table), dtype=torch.int32)
    slots = [token_slots(t, c, n, block_size) for t, c, n in zip(block_tables, context_lens, seq_lens)]
    return AttentionBatch(
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        context_lens=torch.tensor(list(context_lens), dtype=torch.int32, device=device),
        block_tables=tables.to(device),
        slot_mapping=torch.cat(slots).to(device) if slots else torch.zeros(0, dtype=torch.int64, device=device),
        query_start_loc_host=starts,
        seq_lens_host=seq_lens,
        context_lens_host=list(context_lens),
        block_tables_host=tables.numpy(),
        block_size=block_size,
    )


def causal_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    context_len: int,
    scale: float,
    *,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    kv_head_of: torch.Tensor | None = None,
    mask_shift: int = 0,
    window_shift: int = 0,
) -> torch.Tensor:
    """float64 attention of ``query`` ``[q, heads, d]`` over ``keys``/``values`` ``[L, kv_heads, d]``.

    Keys sit at positions ``0 .. L-1``; query ``i`` sits at position ``p = context_len + i`` and
    sees the keys at positions ``j <= p`` (and ``j > p - sliding_window`` when a window is set).
    Scores are ``q·k * scale``, then ``cap * tanh(score / cap)`` with ``logits_soft_cap``.
    Query head ``h`` reads KV head ``h // (heads // kv_heads)``. ``kv_head_of``, ``mask_shift``
    and ``window_shift`` (a window of ``sliding_window + window_shift`` keys) replace those
    rules; they exist to recognise plausible bugs in failure messages, not for correct use.
    """
    num_heads, num_kv_heads = query.shape[1], keys.shape[1]
    if kv_head_of is None:
        kv_head_of = torch.arange(num_heads) // (num_heads // num_kv_heads)
    k = keys.double().cpu()[:, kv_head_of]
    v = values.double().cpu()[:, kv_head_of]
    scores = torch.einsum("qhd,khd->hqk", query.double().cpu(), k) * scale
    if logits_soft_cap is not None:
        scores = logits_soft_cap * torch.tanh(scores / logits_soft_cap)
    query_pos = torch.arange(context_len, context_len + query.shape[0])[:, None]
    key_pos = torch.arange(k.shape[0])[None, :]
    visible = key_pos <= query_pos + mask_shift
    if sliding_window is not None:
        visible &= key_pos > query_pos - (sliding_window + window_shift)
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    # Only a bug variant can leave a query seeing nothing: it then attends to nothing.
    return torch.einsum("hqk,khd->qhd", probs.nan_to_num(0.0), v)


@dataclass
class PagedCase:
    """A random batch: queries and this step's K/V, each sequence's cached K/V, and the batch
    description on randomly permuted block tables (block 0, the null block, is never used)."""

    batch: AttentionBatch
    query: torch.Tensor
    """``[num_tokens, heads, d]``"""
    key: torch.Tensor
    """This step's keys, ``[num_tokens, kv_heads, d]``."""
    value: torch.Tensor
    past_keys: list[torch.Tensor]
    """Per sequence, the keys of its ``context_len`` cached tokens, ``[context_len, kv_heads, d]``."""
    past_values: list[torch.Tensor]
    tables: list[list[int]]
    """Per sequence, the physical blocks of its tokens in order."""
    num_blocks: int
    """Blocks in the cache the tables point into (block 0 included)."""

    @property
    def context_lens(self) -> list[int]:
        return [s - q for s, q in zip(self.batch.seq_lens_host, self.batch.query_lens_host)]


def make_paged_case(
    seqs: list[tuple[int, int]],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    num_blocks: int | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> PagedCase:
    """``seqs`` lists ``(context_len, query_len)`` per sequence; blocks are drawn at random from
    1 .. num_blocks-1 (None: twice the blocks the sequences need, plus two)."""
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-(c + q) // block_size) for c, q in seqs]
    num_blocks = num_blocks or 2 * sum(needed) + 2
    if sum(needed) > num_blocks - 1:
        raise ValueError(f"not enough blocks for this case: {sum(needed)} needed, {num_blocks - 1} usable")
    free = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    tables = [[free.pop() for _ in range(n)] for n in needed]
    num_tokens = sum(q for _, q in seqs)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    return PagedCase(
        batch=build_batch(tables, [c for c, _ in seqs], [q for _, q in seqs], block_size, device),
        query=rand(num_tokens, num_heads, head_dim),
        key=rand(num_tokens, num_kv_heads, head_dim),
        value=rand(num_tokens, num_kv_heads, head_dim),
        past_keys=[rand(c, num_kv_heads, head_dim) for c, _ in seqs],
        past_values=[rand(c, num_kv_heads, head_dim) for c, _ in seqs],
        tables=tables,
        num_blocks=num_blocks,
    )


def past_batch(case: PagedCase) -> tuple[AttentionBatch, torch.Tensor, torch.Tensor] | None:
    """A prefill batch that stores every sequence's cached tokens, with their keys and values
    (None when no sequence has any): how a test fills the cache through ``write_kv``."""
    rows = [i for i, c in enumerate(case.context_lens) if c]
    if not rows:
        return None
    batch = build_batch(
        [case.tables[i] for i in rows],
        [0] * len(rows),
        [case.context_lens[i] for i in rows],
        case.batch.block_size,
        case.batch.slot_mapping.device,
    )
    return batch, torch.cat([case.past_keys[i] for i in rows]), torch.cat([case.past_values[i] for i in rows])


def random_seqs(
    rng: random.Random,
    decode_only: bool,
    *,
    max_seqs: int,
    short_context: int,
    long_context: tuple[int, int],
    max_query: int,
) -> list[tuple[int, int]]:
    """``(context_len, query_len)`` of 1 .. ``max_seqs`` random sequences (for :func:`make_paged_case`),
    mixing whole prefills (no context), chunked prefills of 2 .. ``max_query`` tokens after a short
    (1 .. ``short_context``) or long (``long_context`` bounds) context, and decodes (one new token
    after at least one cached; every sequence with ``decode_only``, else 40% of them)."""
    seqs = []
    for _ in range(rng.randint(1, max_seqs)):
        context = rng.choice([0, rng.randint(1, short_context), rng.randint(*long_context)])
        query = 1 if decode_only or rng.random() < 0.4 else rng.randint(2, max_query)
        seqs.append((max(context, 1) if query == 1 else context, query))
    return seqs


def random_paged_case(
    seed: int,
    decode_only: bool,
    *,
    block_sizes: Sequence[int],
    windows: Sequence[int | None],
    head_dim: int = 64,
    **seq_shape: Any,
) -> tuple[PagedCase, LayerAttentionSpec]:
    """A random :func:`make_paged_case` and the layer to attend it with, both from ``seed``: a block
    size from ``block_sizes``, sequences from :func:`random_seqs` (``seq_shape`` are its keyword
    arguments), MHA, GQA or MQA heads, and a layer of a random scale, sliding window (from
    ``windows``) and soft-cap (none, tight or loose)."""
    rng = random.Random(seed)
    block_size = rng.choice(block_sizes)
    seqs = random_seqs(rng, decode_only, **seq_shape)
    heads, kv_heads = rng.choice([(4, 4), (8, 2), (4, 1)])
    layer = LayerAttentionSpec(
        scale=rng.choice([0.125, 0.3]),
        sliding_window=rng.choice(windows),
        logits_soft_cap=rng.choice([None, 1.5, 30.0]),
    )
    return make_paged_case(seqs, heads, kv_heads, head_dim, block_size, seed=seed), layer


def step_params(num_seeds: int) -> list[Any]:
    """``pytest.param(seed, decode_only)`` for seeds ``0 .. num_seeds-1``, each as a mixed and a
    decode-only step (ids ``seed3-mixed``, ``seed3-decode``): the parameters of :func:`random_paged_case`."""
    import pytest

    return [
        pytest.param(seed, decode_only, id=f"seed{seed}-{'decode' if decode_only else 'mixed'}")
        for seed in range(num_seeds)
        for decode_only in (False, True)
    ]


def filled_cache(case: PagedCase, kv_dim: int, seed: int = 0) -> torch.Tensor:
    """A float32 KV cache of ``case``'s blocks, ``[blocks, block_size, kv_heads, d]`` with an axis of 2
    (K, V) inserted at ``kv_dim`` (0: ``(2, blocks, ...)``; 1: FlashInfer's NHD ``(blocks, 2, ...)``).

    It holds every sequence's cached K/V (:func:`past_batch`) and this step's, stored by
    :func:`~kvserve.layers.kv_store.store_kv`, and garbage around 50 elsewhere, so that a kernel
    reading a slot it should not shows in its output.
    """
    kv_heads, head_dim = case.key.shape[1:]
    shape = [case.num_blocks, case.batch.block_size, kv_heads, head_dim]
    shape.insert(kv_dim, 2)
    cache = 50 + torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    k_cache, v_cache = cache.select(kv_dim, 0), cache.select(kv_dim, 1)
    past = past_batch(case)
    if past is not None:
        batch, keys, values = past
        store_kv(k_cache, v_cache, keys, values, batch.slot_mapping)
    store_kv(k_cache, v_cache, case.key, case.value, case.batch.slot_mapping)
    return cache


def reference_attention(case: PagedCase, scale: float, **variant) -> torch.Tensor:
    """float64 ``[num_tokens, heads, d]``: each sequence's queries over its cached plus new K/V.

    ``variant`` is passed to :func:`causal_attention`: a layer's ``sliding_window`` and
    ``logits_soft_cap``, or the arguments that name a bug (see there).
    """
    batch = case.batch
    out = torch.empty(case.query.shape, dtype=torch.float64)
    with single_thread():
        for i, context in enumerate(case.context_lens):
            start, end = batch.query_start_loc_host[i], batch.query_start_loc_host[i + 1]
            keys = torch.cat([case.past_keys[i], case.key[start:end]])
            values = torch.cat([case.past_values[i], case.value[start:end]])
            out[start:end] = causal_attention(case.query[start:end], keys, values, context, scale, **variant)
    return out


def layer_reference_attention(case: PagedCase, layer: LayerAttentionSpec) -> torch.Tensor:
    """:func:`reference_attention` with ``layer``'s scale, sliding window and soft-cap."""
    return reference_attention(
        case, layer.scale, sliding_window=layer.sliding_window, logits_soft_cap=layer.logits_soft_cap
    )


class ReferenceAttentionBackend(AttentionBackend):
    """A slow, obviously correct backend: each sequence's K/V is gathered slot by slot through
    its block table and attended with :func:`causal_attention`.

    Not registered as a plugin: the model contract and :class:`~kvserve.testing.paged_model.PagedSequences`
    use it so that model tests do not depend on an attention plugin. Layout ``(2, blocks, block_size,
    kv_heads, d)``: K then V, in ``spec.cache_dtype``.
    """

    name = "reference"
    # Plain torch ops: the host and whatever accelerator this torch build drives.
    device_types = ("cpu", *(d.type for d in [torch.accelerator.current_accelerator()] if d is not None))
    supported_dtypes = ("float32", "bfloat16", "float16")

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        spec = self.spec
        return (2, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)

    def build_metadata(self, batch: AttentionBatch) -> AttentionBatch:
        return batch

    def write_kv(
        self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, metadata: AttentionBatch
    ) -> None:
        slots = metadata.slot_mapping
        stored = slots >= 0  # -1: a padded token
        kv_cache[0].view(-1, *key.shape[1:])[slots[stored]] = key[stored].to(kv_cache.dtype)
        kv_cache[1].view(-1, *value.shape[1:])[slots[stored]] = value[stored].to(kv_cache.dtype)

    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionBatch, layer_idx: int):
        layer = self.spec.layers[layer_idx]
        batch = metadata
        keys_by_slot = kv_cache[0].flatten(0, 1)
        values_by_slot = kv_cache[1].flatten(0, 1)
        out = torch.empty_like(query)
        with single_thread():
            for i, seq_len in enumerate(batch.seq_lens_host):
                start, end = batch.query_start_loc_host[i], batch.query_start_loc_host[i + 1]
                slots = token_slots(batch.block_tables_host[i], 0, seq_len, batch.block_size).to(kv_cache.device)
                attended = causal_attention(
                    query[start:end], keys_by_slot[slots], values_by_slot[slots], seq_len - (end - start),
                    layer.scale, sliding_window=layer.sliding_window, logits_soft_cap=layer.logits_soft_cap,
                )  # fmt: skip
                out[start:end] = attended.to(query.dtype)
        return out
