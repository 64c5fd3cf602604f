"""Prefix caching in the paged KV cache manager: hits, accounting, eviction order, collisions, reset."""

import pytest

from kvserve.kv_cache.paged import PagedKVCacheManager
from kvserve.kv_cache.prefix_cache import PrefixCache
from kvserve.lora import LoRARequest
from kvserve.request import Request
from kvserve.sampling_params import SamplingParams

BS = 4


def _request(rid: str, tokens: list[int], salt: str | None = None) -> Request:
    return Request(rid, list(tokens), SamplingParams(), cache_salt=salt)


def _manager(num_blocks: int = 32, **kwargs) -> PagedKVCacheManager:
    return PagedKVCacheManager(num_blocks, BS, enable_prefix_caching=True, **kwargs)


def _admit(manager: PagedKVCacheManager, request: Request) -> int:
    """Admit like the scheduler does, then mark the whole prompt computed; returns the cached tokens."""
    cached = manager.num_cached_tokens(request)
    request.num_computed_tokens = cached
    assert manager.allocate_slots(request, request.num_tokens - cached, cached)
    request.num_computed_tokens = request.num_tokens
    return cached


def _run_and_free(manager: PagedKVCacheManager, request: Request) -> int:
    cached = _admit(manager, request)
    manager.free(request)
    return cached


def test_longest_prefix_of_full_blocks_is_reused_and_the_last_token_recomputed():
    manager = _manager()
    a = _request("a", range(10))  # blocks [0..3] [4..7], then 2 tokens
    assert _run_and_free(manager, a) == 0
    assert manager.num_cached_tokens(_request("b", [*range(8), 99])) == 8
    assert manager.num_cached_tokens(_request("c", range(8))) == 4, "the last token must be recomputed"
    assert manager.num_cached_tokens(_request("d", [*range(6), 99, 99, 99])) == 4
    assert manager.num_cached_tokens(_request("e", [99, *range(1, 10)])) == 0, "the first block differs"


def test_hit_blocks_are_shared_and_accounting_is_exact():
    manager = _manager()
    a = _request("a", range(10))
    _admit(manager, a)
    manager.allocate_slots(a, 1)  # the next step registers a's computed full blocks
    b = _request("b", [*range(8), 50, 51, 52])
    assert _admit(manager, b) == 8
    assert manager.block_table("b")[:2] == manager.block_table("a")[:2]
    assert manager.block_table("b")[2] not in manager.block_table("a")
    assert [manager.pool.ref_counts[blk] for blk in manager.block_table("a")[:2]] == [2, 2]
    c = _request("c", range(8))
    assert _admit(manager, c) == 4
    stats = manager.stats()
    assert (stats.prefix_queries, stats.prefix_hits) == (10 + 11 + 8, 0 + 8 + 4)
    assert stats.prefix_hit_rate == 12 / 29
    for request in (a, b, c):
        manager.free(request)
    assert manager.num_free_blocks() == 31 and not any(manager.pool.ref_counts)


def test_lookups_do_not_count_until_admitted():
    manager = _manager()
    _run_and_free(manager, _request("a", range(9)))
    for _ in range(3):
        manager.num_cached_tokens(_request("b", range(9)))
    assert (manager.stats().prefix_queries, manager.stats().prefix_hits) == (9, 0)


def test_scheduled_blocks_are_offered_at_once_and_withdrawn_if_never_computed():
    manager = _manager()
    a = _request("a", range(9))
    assert manager.allocate_slots(a, 5)  # a first chunk fills block 0: same-step requests may reuse it
    assert manager.num_cached_tokens(_request("b", range(9))) == 4
    a.num_computed_tokens = 5
    assert manager.allocate_slots(a, 4)  # the second chunk fills block 1
    assert manager.num_cached_tokens(_request("b", range(9))) == 8
    manager.free(a)  # preempted before the second chunk ran: block 1 never gets its KV
    assert manager.num_cached_tokens(_request("b", range(9))) == 4
    assert len(manager.prefix_cache) == 1


def test_freeing_a_request_whose_unwritten_block_another_reuses_is_refused():
    manager = _manager()
    a = _request("a", range(9))
    assert manager.allocate_slots(a, 9)
    b = _request("b", range(9))
    assert _admit(manager, b) == 8  # reuses blocks a computes in this step
    with pytest.raises(RuntimeError, match="must not preempt after its first admission"):
        manager.free(a)


def test_preempted_request_resumes_from_its_own_cached_blocks_including_output():
    manager = _manager()
    a = _request("a", range(6))
    _admit(manager, a)
    for token in (100, 101, 102):  # three decode steps
        a.output_token_ids.append(token)
        assert manager.allocate_slots(a, 1)
        a.num_computed_tokens += 1
    manager.free(a)  # preempted with 9 computed tokens: 2 full blocks
    a.num_computed_tokens = 0
    assert manager.num_cached_tokens(a) == 8


def test_freed_blocks_stay_cached_and_lru_evicts_chain_tails_first():
    manager = _manager(num_blocks=7)  # 6 usable blocks
    a = _request("a", range(13))  # 3 full blocks + 1 token: 4 blocks
    _run_and_free(manager, a)
    a_blocks = manager.prefix_cache.match([tuple(range(i, i + 4)) for i in (0, 4, 8)], ())
    assert len(a_blocks) == 3 and manager.num_free_blocks() == 6
    filler = _request("f", [200, 201, 202])  # 1 block: takes a never-used free block, evicts nothing
    _admit(manager, filler)
    assert manager.num_cached_tokens(_request("q", range(13))) == 12
    other = _request("o", range(300, 309))  # 3 blocks: the last never-used one, a's partial one, a's tail
    _admit(manager, other)
    assert a_blocks[2].block_id not in manager.prefix_cache
    assert manager.num_cached_tokens(_request("q", range(13))) == 8, "the head of the chain survives"


def test_hit_refreshes_lru_position():
    manager = _manager(num_blocks=5)  # 4 usable blocks
    a, b = _request("a", [*range(4), 9]), _request("b", [*range(10, 14), 9])
    _run_and_free(manager, a)  # 2 blocks
    _run_and_free(manager, b)  # 2 blocks, freed after a's
    assert _run_and_free(manager, _request("a2", [*range(4), 8])) == 4  # a is now the most recently used
    _admit(manager, _request("x", [77] * 5))  # 2 blocks: b's partial one, then b's full one (least recent)
    assert manager.num_cached_tokens(_request("a3", [*range(4), 7])) == 4
    assert manager.num_cached_tokens(_request("b2", [*range(10, 14), 7])) == 0


def test_allocation_counts_free_cached_hit_blocks_against_the_free_pool():
    manager = _manager(num_blocks=4)  # 3 usable
    _run_and_free(manager, _request("a", range(9)))  # 3 blocks, 2 full ones cached, all free
    b = _request("b", [*range(8), 50, 51, 52, 53, 54])  # reuses 2, needs 2 fresh: only 1 left
    cached = manager.num_cached_tokens(b)
    b.num_computed_tokens = cached
    assert not manager.allocate_slots(b, b.num_tokens - cached, cached)
    assert manager.num_free_blocks() == 3 and manager.num_cached_tokens(b) == 8, "refused with nothing taken"


def test_cache_salt_separates_caches():
    manager = _manager()
    _run_and_free(manager, _request("a", range(9), salt="tenant-1"))
    assert manager.num_cached_tokens(_request("b", range(9), salt="tenant-2")) == 0
    assert manager.num_cached_tokens(_request("c", range(9))) == 0
    assert manager.num_cached_tokens(_request("d", range(9), salt="tenant-1")) == 8


def test_lora_adapters_separate_caches():
    """Two adapters never share KV blocks (nor an adapter and the base model); one adapter does."""
    sql, chat = LoRARequest("sql", 1, "/adapters/sql"), LoRARequest("chat", 2, "/adapters/chat")
    manager = _manager()
    _run_and_free(manager, Request("a", list(range(9)), SamplingParams(), lora_request=sql))
    assert manager.num_cached_tokens(Request("b", list(range(9)), SamplingParams(), lora_request=chat)) == 0
    assert manager.num_cached_tokens(_request("c", range(9))) == 0
    assert manager.num_cached_tokens(Request("d", list(range(9)), SamplingParams(), lora_request=sql)) == 8
    salted = Request("e", list(range(9)), SamplingParams(), cache_salt="tenant-1", lora_request=sql)
    assert manager.num_cached_tokens(salted) == 0, "the salt still separates requests of one adapter"


def test_forced_hash_collisions_never_reuse_wrong_blocks():
    manager = _manager(hash_fn=lambda parent, tokens, extra: 0)  # every block collides
    _run_and_free(manager, _request("a", range(13)))
    assert manager.num_cached_tokens(_request("b", [*range(100, 104), *range(4, 13)])) == 0
    assert manager.num_cached_tokens(_request("c", range(13))) == 4, "only the first block got the hash slot"
    _run_and_free(manager, _request("d", range(100, 113)))  # its blocks find the slot taken: none cached
    assert manager.num_cached_tokens(_request("e", range(100, 113))) == 0
    assert not any(manager.pool.ref_counts)


def test_lookup_checks_the_parent_block_not_only_the_tokens():
    # A hash that ignores the parent makes equal blocks collide after different prefixes.
    manager = _manager(hash_fn=lambda parent, tokens, extra: hash(tokens))
    _run_and_free(manager, _request("x", [*range(4), *range(50, 54), 0]))  # X then T
    _run_and_free(manager, _request("y", [*range(10, 14), 0]))  # Y
    assert manager.num_cached_tokens(_request("yt", [*range(10, 14), *range(50, 54), 0])) == 4


def test_prefix_cache_verifies_and_evicts():
    cache = PrefixCache(hash_fn=lambda parent, tokens, extra: 7)
    first = cache.insert(1, None, (1, 2), ())
    assert first is not None and cache.insert(1, None, (1, 2), ()) is first
    assert cache.insert(2, None, (3, 4), ()) is None, "a collision must not take the slot"
    assert cache.match([(3, 4)], ()) == [] and cache.match([(1, 2), (1, 2)], ()) == [first]
    cache.evict(1)
    assert len(cache) == 0 and cache.match([(1, 2)], ()) == []


def test_reset_prefix_cache_only_when_nothing_is_held():
    manager = _manager()
    _run_and_free(manager, _request("a", range(9)))
    held = _request("h", [60, 61])
    _admit(manager, held)
    assert not manager.reset_prefix_cache()
    assert manager.num_cached_tokens(_request("b", range(9))) == 8
    manager.free(held)
    assert manager.reset_prefix_cache()
    assert manager.num_cached_tokens(_request("b", range(9))) == 0 and len(manager.prefix_cache) == 0


def test_disabled_prefix_caching_never_hits_or_counts():
    manager = PagedKVCacheManager(32, BS, enable_prefix_caching=False)
    _run_and_free(manager, _request("a", range(9)))
    assert _run_and_free(manager, _request("b", range(9))) == 0
    assert len(manager.prefix_cache) == 0 and manager.stats().prefix_queries == 0


def test_prompt_logprobs_requests_compute_every_position_and_are_not_counted():
    manager = _manager()
    _run_and_free(manager, _request("a", range(9)))
    wants_logits = Request("b", list(range(9)), SamplingParams(prompt_logprobs=1))
    assert _run_and_free(manager, wants_logits) == 0
    assert manager.stats().prefix_queries == 9
