"""store_kv writes exactly the slots it is given, in either cache layout, and skips padded tokens."""

import torch

from kvserve.layers import store_kv


def test_store_kv_skips_padded_tokens_and_touches_nothing_else():
    cache = torch.randn(2, 4, 8, 2, 16)  # (2, blocks, block_size, kv_heads, d): K then V
    before = cache.clone()
    key, value = torch.randn(3, 2, 16), torch.randn(3, 2, 16)
    store_kv(cache[0], cache[1], key, value, torch.tensor([9, -1, 30]))
    flat = cache.view(2, 32, 2, 16)
    assert torch.equal(flat[0, 9], key[0]) and torch.equal(flat[1, 30], value[2])
    changed = (cache != before).view(2, 32, -1).any(-1)
    assert changed.nonzero()[:, 1].unique().tolist() == [9, 30]


def test_store_kv_in_the_nhd_layout_writes_through_strided_views():
    cache = torch.randn(4, 2, 8, 2, 16)  # FlashInfer's NHD: (blocks, 2, page_size, kv_heads, d)
    before = cache.clone()
    key, value = torch.randn(3, 2, 16), torch.randn(3, 2, 16)
    store_kv(cache[:, 0], cache[:, 1], key, value, torch.tensor([9, -1, 30]))
    assert torch.equal(cache[1, 0, 1], key[0]) and torch.equal(cache[3, 1, 6], value[2])
    changed = (cache != before).any(-1).any(-1)  # [blocks, 2, page_size]
    assert changed.nonzero().tolist() == [[1, 0, 1], [1, 1, 1], [3, 0, 6], [3, 1, 6]]


def test_store_kv_casts_to_the_cache_dtype():
    cache = torch.zeros(2, 2, 4, 1, 8, dtype=torch.float16)
    key, value = torch.randn(2, 1, 8), torch.randn(2, 1, 8)
    store_kv(cache[0], cache[1], key, value, torch.tensor([5, 0]))
    assert torch.equal(cache[0, 1, 1], key[0].half()) and torch.equal(cache[1, 0, 0], value[1].half())
