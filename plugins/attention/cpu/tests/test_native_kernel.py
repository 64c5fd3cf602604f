"""The C++ paged attention operator against the float64 reference: dtypes, GQA/MQA, sliding
windows, soft-caps, block-boundary lengths, mixed batches, prefill rows scored against packed key
tiles, long decodes and short chunks over long contexts split across threads, and verification
steps (1 + k rows) beside decodes;
the cache-write operator against ``index_copy_``."""

import dataclasses

import pytest
import torch

from kvserve.interfaces import LayerAttentionSpec
from kvserve.testing.attention_reference import (
    filled_cache,
    layer_reference_attention,
    make_paged_case,
    random_paged_case,
)
from kvserve_attention_cpu import native_kernel

TOLERANCES = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}
DTYPES = list(TOLERANCES)


@pytest.fixture(scope="module", autouse=True)
def kernel():
    reason = native_kernel.unavailable_reason()
    if reason is not None:
        pytest.skip(f"the C++ kernel cannot be built here: {reason}")


def in_dtype(case, dtype):
    """``case`` with every tensor rounded to ``dtype`` (the reference then sees the same inputs)."""
    cast = {f: getattr(case, f).to(dtype) for f in ("query", "key", "value")}
    cast |= {f: [t.to(dtype) for t in getattr(case, f)] for f in ("past_keys", "past_values")}
    return dataclasses.replace(case, **cast)


def run_kernel(case, layer: LayerAttentionSpec, dtype, padding: int = 0) -> torch.Tensor:
    """The operator's output for ``case``, its query followed by ``padding`` rows no sequence owns
    (left at NaN)."""
    cache = filled_cache(case, 0).to(dtype)
    batch = case.batch
    query = torch.cat([case.query, torch.zeros(padding, *case.query.shape[1:], dtype=case.query.dtype)])
    out = torch.full_like(query, float("nan"))
    torch.ops.kvserve_attention_cpu.paged_attention_out(
        out, query, cache, batch.block_tables, batch.seq_lens, batch.query_start_loc,
        layer.scale, layer.sliding_window or 0, layer.logits_soft_cap or 0.0,
    )  # fmt: skip
    return out


def check(case, layer, dtype, out):
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(out.double(), layer_reference_attention(case, layer), atol=tol, rtol=tol)


SHAPES = dict(max_seqs=6, short_context=20, long_context=(40, 300), max_query=40)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("decode_only", [False, True], ids=["mixed", "decode"])
@pytest.mark.parametrize("seed", range(6))
def test_random_batches_match_reference(seed, decode_only, dtype):
    """Random block sizes, head layouts (MHA, GQA, MQA), scales, windows and soft-caps."""
    case, layer = random_paged_case(seed, decode_only, block_sizes=(16, 5, 1), windows=(None, 1, 7, 64), **SHAPES)
    case = in_dtype(case, dtype)
    check(case, layer, dtype, run_kernel(case, layer, dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128, 40])
def test_block_boundary_lengths(dtype, head_dim):
    """Sequences ending one before, on and one after a block boundary; decodes and prefill chunks;
    head sizes with and without a compiled-in loop (40)."""
    bs = 16
    seqs = [(bs - 1, 1), (bs, 1), (bs + 1, 1), (2 * bs - 2, 1), (0, bs), (0, bs + 1), (bs - 1, bs + 2), (3 * bs, 17)]
    case = in_dtype(make_paged_case(seqs, 9, 3, head_dim, bs, seed=head_dim), dtype)
    for layer in (LayerAttentionSpec(head_dim**-0.5), LayerAttentionSpec(0.3, sliding_window=bs, logits_soft_cap=5.0)):
        check(case, layer, dtype, run_kernel(case, layer, dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("window", [None, 300, 1000])
def test_long_decodes_split_into_key_slices(dtype, window):
    """One or two long decodes on two threads are split into key slices and merged; windows that
    start inside a slice; contexts that end mid-block."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for seqs in ([(2999, 1)], [(1500, 1), (777, 1)]):
            case = in_dtype(make_paged_case(seqs, 8, 1, 64, 16, seed=len(seqs)), dtype)
            layer = LayerAttentionSpec(0.125, sliding_window=window, logits_soft_cap=20.0 if window else None)
            check(case, layer, dtype, run_kernel(case, layer, dtype))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("window", [None, 300, 1000])
def test_short_chunks_over_long_contexts_split_into_key_slices(dtype, window):
    """A chunk of a few rows after thousands of keys, beside short decodes, costs more than a
    thread's share of the step: on two threads its keys are sliced and every row's slices merged,
    slices past a row's position (causal) being empty; windows that start inside a slice."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for seed, seqs in enumerate(([(1500, 10), (40, 1), (90, 1)], [(2999, 16), (1200, 3), (7, 1)])):
            case = in_dtype(make_paged_case(seqs, 9, 3, 64, 16, seed=seed), dtype)
            layer = LayerAttentionSpec(0.125, sliding_window=window, logits_soft_cap=20.0 if window else None)
            check(case, layer, dtype, run_kernel(case, layer, dtype))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("window", [None, 300])
@pytest.mark.parametrize("threads", [1, 2])
def test_verification_steps_beside_decodes_over_long_contexts(dtype, window, threads):
    """Speculative decoding's verification step: 1 + k rows (k = 1..7) after hundreds of keys, causal
    among themselves, beside decodes over as many keys (their windows of keys span several L2
    windows); GQA groups of 4; on one thread, and on two where few items get their keys sliced."""
    seqs = [(301 + 97 * k, 1 + k) for k in range(1, 8)] + [(1100, 1), (650, 1), (1500, 1)]
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for batch in (seqs, seqs[2:4]):
            case = in_dtype(make_paged_case(batch, 16, 4, 64, 16, seed=len(batch)), dtype)
            layer = LayerAttentionSpec(0.125, sliding_window=window, logits_soft_cap=20.0 if window else None)
            check(case, layer, dtype, run_kernel(case, layer, dtype))
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("heads", [(9, 3), (8, 1)], ids=["gqa", "mqa"])
def test_prefill_tiles_match_reference(dtype, head_dim, heads):
    """Prefill items whose rows and heads share packed key tiles: a whole prompt, a chunk after more
    keys than one window holds, tiles that end mid-tile and mid-block, windows that start inside a
    tile, soft-caps; on two threads a chunk of up to 64 rows over a long context is key-sliced."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for seed, seqs in enumerate(([(0, 100), (1000, 40), (37, 23)], [(1900, 48), (60, 1), (200, 1), (5, 11)])):
            case = in_dtype(make_paged_case(seqs, *heads, head_dim, 16, seed=seed), dtype)
            windowed = LayerAttentionSpec(0.1, sliding_window=77, logits_soft_cap=8.0)
            for layer in (LayerAttentionSpec(head_dim**-0.5), windowed):
                check(case, layer, dtype, run_kernel(case, layer, dtype))
    finally:
        torch.set_num_threads(threads)


def test_padding_rows_past_the_batch_are_not_written():
    case = make_paged_case([(5, 1), (0, 7), (30, 1)], 4, 2, 64, 16, seed=3)
    layer = LayerAttentionSpec(0.125)
    out = run_kernel(case, layer, torch.float32, padding=3)
    check(case, layer, torch.float32, out[:9])
    assert out[9:].isnan().all()


def test_rejects_a_table_too_short_for_its_sequence():
    case = make_paged_case([(40, 1)], 4, 2, 64, 16, seed=0)
    batch = case.batch
    with pytest.raises(RuntimeError, match="does not fit its query or block table"):
        torch.ops.kvserve_attention_cpu.paged_attention_out(
            torch.empty_like(case.query), case.query, filled_cache(case, 0), batch.block_tables[:, :2],
            batch.seq_lens, batch.query_start_loc, 0.125, 0, 0.0,
        )  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tokens", [1, 5, 700])
def test_write_kv_matches_index_copy(dtype, tokens):
    """Rows land in their slots, padding (-1) is skipped, other slots keep their contents; key and
    value are strided views of one fused projection, as the models pass them."""
    generator = torch.Generator().manual_seed(tokens)
    num_blocks, block_size, kv_heads, head_dim = 64, 16, 3, 64
    cache = torch.randn(2, num_blocks, block_size, kv_heads, head_dim, generator=generator).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=generator)[:tokens]
    slots[::4] = -1
    fused = torch.randn(tokens, 4 * kv_heads * head_dim, generator=generator).to(dtype)
    key = fused[:, kv_heads * head_dim : 2 * kv_heads * head_dim].view(tokens, kv_heads, head_dim)
    value = fused[:, 3 * kv_heads * head_dim :].view(tokens, kv_heads, head_dim)
    expected = cache.clone()
    kept = slots >= 0
    for half, rows in ((0, key), (1, value)):
        expected[half].view(-1, kv_heads, head_dim).index_copy_(0, slots[kept], rows[kept])
    torch.ops.kvserve_attention_cpu.write_kv(cache, key, value, slots)
    assert torch.equal(cache, expected)


def test_write_kv_rejects_a_slot_outside_the_cache():
    cache = torch.zeros(2, 4, 16, 2, 64)
    rows = torch.ones(2, 2, 64)
    with pytest.raises(RuntimeError, match="token 1's slot 64 is outside the cache's 64 slots"):
        torch.ops.kvserve_attention_cpu.write_kv(cache, rows, rows, torch.tensor([3, 64]))
    assert not cache.any()  # checked before anything is written
