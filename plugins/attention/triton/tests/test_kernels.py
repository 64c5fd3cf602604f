"""The kernels against a float64 PyTorch reference on random paged batches, without the
backend interface: unified attention, split-KV attention and the KV write.

Every case draws its block tables at random from a cache whose unwritten slots hold values
around 50, so a read through a wrong slot shows in the output. Under the CPU interpreter
(no GPU) the whole file runs in about a minute; each test id names what it covers.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from triton_cases import DEVICE, GARBAGE, MIXED, Case, check, make_case, reference

from kvserve_attention_triton.kernels import plan_query_blocks, split_kv_attention, unified_attention, write_kv


def test_kernels_run_where_expected():
    """The file's cases run on the GPU, or in the interpreter when there is none."""
    assert DEVICE.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    print(f"kernels run on {DEVICE} (TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')})")


def run(case: Case, *, scale=None, window=None, soft_cap=None, segments=1, max_block_m=64):
    heads, kv_heads, head_dim = case.query.shape[1], case.keys[0].shape[1], case.query.shape[2]
    batch = case.batch
    scale = head_dim**-0.5 if scale is None else scale
    tiles = plan_query_blocks(batch.query_lens_host, heads // kv_heads, DEVICE, max_block_m)
    args = (case.query, case.cache[0], case.cache[1], batch.block_tables, batch.query_start_loc, batch.seq_lens, tiles)
    options = dict(scale=scale, sliding_window=window, logits_soft_cap=soft_cap)
    if segments > 1:
        return split_kv_attention(*args, max_seq_len=batch.max_seq_len, num_segments=segments, **options)
    return unified_attention(*args, **options)


def attend_and_check(case, **facts):
    if facts.get("scale") is None:
        facts["scale"] = case.query.shape[2] ** -0.5
    check(case, run(case, **facts), **facts)


# -- unified kernel --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (4, 1), (6, 2)], ids=["mha", "gqa4", "mqa", "gqa3"])
def test_unified_dtypes_and_head_layouts(dtype, heads):
    attend_and_check(make_case(MIXED, *heads, 64, 16, dtype, seed=heads[0] + heads[1]))


@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
def test_unified_head_sizes(head_dim):
    """Head sizes that are not powers of two are padded with masks."""
    attend_and_check(make_case(MIXED, 8, 2, head_dim, 16, torch.float32, seed=head_dim))


@pytest.mark.parametrize("block_size", [16, 32, 48, 64, 256])
def test_unified_block_sizes_cross_block_boundaries(block_size):
    """Every sequence spans more than one block (lengths scale with the block size)."""
    b = block_size
    seqs = [(0, b + 3), (2 * b + 1, 1), (b - 1, 2), (b + 5, b // 2), (3 * b, 1)]
    attend_and_check(make_case(seqs, 4, 2, 64, block_size, torch.float32, seed=block_size))


@pytest.mark.parametrize(
    ("window", "soft_cap", "scale"),
    [(1, None, None), (7, None, None), (32, None, None), (None, 5.0, None), (None, None, 0.3), (20, 30.0, 1.0 / 11)],
    ids=["window1", "window7", "window32", "softcap5", "scale0.3", "window20-softcap30-scale1/11"],
)
def test_unified_window_soft_cap_and_scale(window, soft_cap, scale):
    seqs = [(0, 40), (60, 1), (33, 17), (5, 1), (70, 9)]
    attend_and_check(
        make_case(seqs, 8, 2, 64, 16, torch.float32, seed=3), window=window, soft_cap=soft_cap, scale=scale
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_unified_strided_views_of_a_fused_qkv(dtype):
    """Query slices of a fused qkv projection output (row stride of all heads) are read in place."""
    attend_and_check(make_case(MIXED, 8, 2, 80, 16, dtype, seed=9, qkv=True))


def test_unified_block_ids_near_the_end_of_a_large_pool():
    """Slot arithmetic stays exact for the last blocks of a pool of 20000 (int64 offsets)."""
    blocks = list(range(19_960, 20_000))
    attend_and_check(make_case(MIXED, 4, 1, 64, 16, torch.float32, seed=4, blocks=blocks, num_blocks=20_000))


def test_unified_64_sequences_of_very_different_lengths():
    gen = torch.Generator().manual_seed(64)
    lengths = torch.randint(1, 200, (64,), generator=gen).tolist()
    seqs = [(n - 1, 1) if i % 4 else (n - min(n, 12), min(n, 12)) for i, n in enumerate(lengths)]
    seqs[0], seqs[1] = (0, 1), (511, 1)
    attend_and_check(make_case(seqs, 4, 2, 64, 32, torch.bfloat16, seed=64))


def test_unified_long_prefill_uses_many_tiles_per_sequence():
    """A prefill longer than one query tile, with small tiles (16 rows of 4 query heads = 4 tokens)."""
    case = make_case([(0, 37), (9, 22)], 8, 2, 64, 16, torch.float32, seed=11)
    out = run(case, max_block_m=16)
    check(case, out, scale=64**-0.5)


# -- split-KV ----------------------------------------------------------------------------------
@pytest.mark.parametrize("segments", [2, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_split_kv_decodes(segments, dtype):
    """Long decodes cut into segments (some empty for the shorter sequences) merge exactly."""
    seqs = [(300, 1), (17, 1), (129, 1), (1, 1)]
    attend_and_check(make_case(seqs, 8, 2, 128, 16, dtype, seed=segments), segments=segments)


def test_split_kv_with_window_soft_cap_and_a_mixed_batch():
    """Segments wholly outside a window leave empty partials; prefills work through the same path."""
    case = make_case(MIXED + [(200, 1)], 4, 2, 96, 32, torch.float32, seed=8)
    attend_and_check(case, segments=4, window=24, soft_cap=20.0, scale=0.2)


# -- KV write ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_write_kv_stores_exactly_the_slots_and_skips_padding(dtype):
    """Each token's K/V lands in its slot, slots of -1 (padding) are skipped, nothing else changes;
    key/value may be strided views of a fused qkv tensor."""
    tokens, kv_heads, head_dim, block_size, num_blocks = 11, 3, 80, 16, 9
    gen = torch.Generator().manual_seed(1)
    fused = torch.randn(tokens, (4 + 2) * kv_heads * head_dim, generator=gen).to(dtype).to(DEVICE)
    split = 4 * kv_heads * head_dim
    key = fused[:, split : split + kv_heads * head_dim].view(tokens, kv_heads, head_dim)
    value = fused[:, split + kv_heads * head_dim :].view(tokens, kv_heads, head_dim)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    slots[[2, 7]] = -1
    cache = (GARBAGE + torch.randn(2, num_blocks, block_size, kv_heads, head_dim, generator=gen)).to(dtype).to(DEVICE)
    before = cache.clone()
    write_kv(key, value, cache[0], cache[1], slots.to(DEVICE))
    expected = before.clone()
    kept = slots >= 0
    expected[0].view(-1, kv_heads, head_dim)[slots[kept]] = key[kept.to(DEVICE)]
    expected[1].view(-1, kv_heads, head_dim)[slots[kept]] = value[kept.to(DEVICE)]
    assert torch.equal(cache, expected)


def test_write_kv_near_the_end_of_a_large_pool_and_into_another_dtype():
    """The last slot of a 20000-block pool; float32 K/V stored into a float16 cache."""
    kv_heads, head_dim, block_size, num_blocks = 2, 64, 16, 20_000
    last = num_blocks * block_size - 1
    slots = torch.tensor([last, last - 17, 5], dtype=torch.int64, device=DEVICE)
    key = torch.randn(3, kv_heads, head_dim, device=DEVICE)
    value = torch.randn(3, kv_heads, head_dim, device=DEVICE)
    cache = torch.zeros(2, num_blocks, block_size, kv_heads, head_dim, dtype=torch.float16, device=DEVICE)
    write_kv(key, value, cache[0], cache[1], slots)
    flat_k, flat_v = cache[0].view(-1, kv_heads, head_dim), cache[1].view(-1, kv_heads, head_dim)
    assert torch.equal(flat_k[slots], key.half()) and torch.equal(flat_v[slots], value.half())
    untouched = torch.ones(flat_k.shape[0], dtype=torch.bool, device=DEVICE)
    untouched[slots] = False
    assert not flat_k[untouched].any() and not flat_v[untouched].any(), "write_kv wrote outside slot_mapping"


def test_reference_is_not_trivially_satisfied():
    """The reference distinguishes a window from none and a soft-cap from none on these cases."""
    case = make_case([(0, 40), (60, 1)], 4, 2, 64, 16, torch.float32, seed=3)
    base = reference(case, 0.125)
    assert not torch.allclose(base, reference(case, 0.125, window=7), atol=1e-3)
    assert not torch.allclose(base, reference(case, 0.125, soft_cap=0.5), atol=1e-3)
    assert math.isfinite(float(base.abs().max()))
