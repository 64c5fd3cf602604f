"""``KVCacheManager.fork`` for ``n > 1``: full blocks shared, a partial last block copied on write."""

import pytest

from kvserve.kv_cache.paged import PagedKVCacheManager
from kvserve.request import Request
from kvserve.sampling_params import SamplingParams

BS = 4


def _computed(rid: str, tokens: list[int], num_computed: int) -> Request:
    request = Request(rid, list(tokens), SamplingParams())
    request.num_computed_tokens = num_computed
    return request


def _parent(manager: PagedKVCacheManager, num_tokens: int) -> Request:
    parent = _computed("p", range(num_tokens), 0)
    assert manager.allocate_slots(parent, num_tokens)
    parent.num_computed_tokens = num_tokens
    return parent


@pytest.mark.parametrize("caching", [True, False])
def test_fork_shares_full_blocks_and_copies_the_partial_one(caching):
    manager = PagedKVCacheManager(16, BS, enable_prefix_caching=caching)
    parent = _parent(manager, 10)
    p_table = manager.block_table("p")
    child = _computed("c", range(10), 10)
    copies = manager.fork(parent, child)
    c_table = manager.block_table("c")
    assert c_table[:2] == p_table[:2] and c_table[2] not in p_table
    assert copies == [(p_table[2], c_table[2])]
    assert [manager.pool.ref_counts[b] for b in p_table] == [2, 2, 1]
    manager.free(parent)
    assert [manager.pool.ref_counts[b] for b in c_table] == [1, 1, 1]
    manager.free(child)
    assert manager.num_free_blocks() == 15 and not any(manager.pool.ref_counts)


def test_fork_at_a_block_boundary_copies_nothing():
    manager = PagedKVCacheManager(16, BS)
    parent = _parent(manager, 10)
    child = _computed("c", range(8), 8)
    assert manager.fork(parent, child) == []
    assert manager.block_table("c") == manager.block_table("p")[:2]


def test_fork_without_a_free_block_holds_nothing():
    manager = PagedKVCacheManager(4, BS)  # 3 usable blocks, all the parent's
    parent = _parent(manager, 10)
    child = _computed("c", range(10), 10)
    assert manager.fork(parent, child) is None
    assert [manager.pool.ref_counts[b] for b in manager.block_table("p")] == [1, 1, 1]
    with pytest.raises(KeyError):
        manager.block_table("c")


def test_fork_refuses_kv_the_parent_has_no_blocks_for():
    manager = PagedKVCacheManager(16, BS)
    parent = _parent(manager, 6)
    with pytest.raises(ValueError, match="holds blocks for 8"):
        manager.fork(parent, _computed("c", range(9), 9))


def test_forked_sequences_extend_the_same_cached_chain():
    manager = PagedKVCacheManager(16, BS, enable_prefix_caching=True)
    parent = _parent(manager, 6)
    child = _computed("c", range(6), 6)
    manager.fork(parent, child)
    for request, token in ((parent, 100), (child, 200)):  # each samples its own tokens
        request.output_token_ids += [token, token + 1, token + 2]
        assert manager.allocate_slots(request, 3)
        request.num_computed_tokens = 9
        manager.free(request)
    for token in (100, 200):
        assert manager.num_cached_tokens(_computed("q", [*range(6), token, token + 1, token + 2], 0)) == 8
    assert not any(manager.pool.ref_counts)
