import pytest

from kvserve.kv_cache.block_pool import NULL_BLOCK, BlockPool
from kvserve.kv_cache.paged import PagedKVCacheManager
from kvserve.request import Request
from kvserve.sampling_params import SamplingParams


def test_pool_never_hands_out_the_null_block_and_refuses_without_partial_allocation():
    pool = BlockPool(5)
    blocks = pool.allocate(4)
    assert sorted(blocks) == [1, 2, 3, 4] and NULL_BLOCK not in blocks
    assert pool.allocate(1) is None and pool.num_free() == 0
    pool.release(blocks[:2])
    assert pool.allocate(3) is None and pool.num_free() == 2  # refused whole, nothing taken


def test_shared_block_returns_only_after_last_holder():
    pool = BlockPool(3)
    (block,) = pool.allocate(1)
    pool.share(block)
    pool.release([block])
    assert pool.num_free() == 1
    pool.release([block])
    assert pool.num_free() == 2
    with pytest.raises(ValueError, match="released more often"):
        pool.release([block])


def _request(rid: str, n: int) -> Request:
    return Request(rid, list(range(n)), SamplingParams())


def test_manager_allocates_by_block_and_frees_everything():
    manager = PagedKVCacheManager(num_blocks=6, block_size=4)
    a = _request("a", 9)
    assert manager.allocate_slots(a, 9)
    assert len(manager.block_table("a")) == 3
    a.num_computed_tokens = 9
    assert manager.allocate_slots(a, 3)  # fits in the third block
    assert len(manager.block_table("a")) == 3
    assert manager.allocate_slots(a, 4)
    assert len(manager.block_table("a")) == 4
    b = _request("b", 8)
    assert not manager.allocate_slots(b, 8)  # needs 2, 1 free: refused with nothing held
    assert manager.num_free_blocks() == 1
    manager.free(a)
    assert manager.num_free_blocks() == 5 and manager.stats().usage == 0.0
