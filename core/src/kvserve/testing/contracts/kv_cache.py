"""The KVCacheManager contract: exact block accounting, all-or-nothing allocation, and prefix caching."""

from __future__ import annotations

import random
from typing import ClassVar

import pytest

from kvserve.interfaces import KVCacheManager
from kvserve.request import Request
from kvserve.sampling_params import SamplingParams
from kvserve.testing.contracts._base import ComponentContract

BLOCK_SIZE = 4


def make_request(request_id: str, tokens: list[int] | range, salt: str | None = None) -> Request:
    """A request whose prompt is ``tokens`` (what managers see: ids, tokens, cache salt)."""
    return Request(request_id, list(tokens), SamplingParams(), cache_salt=salt)


class KVCacheManagerContract(ComponentContract):
    """Every KV cache manager plugin must pass this. Subclass it and name the manager::

        class TestMyManager(KVCacheManagerContract):
            kv_cache_manager = "my_manager"

    The manager is built as the engine builds it, ``cls(num_blocks, block_size,
    enable_prefix_caching)``, and called as the scheduler calls it: :meth:`admit` shows the
    sequence (lookup, set ``num_computed_tokens``, ``allocate_slots``). Checked:

    - a fresh manager offers every block but the null block 0; stats agree with the counts;
    - block tables cover exactly ``ceil(tokens / block_size)`` blocks, never block 0, never a
      block another request holds (without shared prefixes), and only grow at the end;
    - an allocation that does not fit returns False holding nothing new, and leaves the
      manager fully usable;
    - ``free`` returns every block, is a no-op for a request holding none, and random
      admit/grow/free/preempt sequences keep ``free + held == usable`` exactly;
    - prefix caching (section below): computed full blocks are reused by requests with the
      same leading tokens (and cache salt), shared blocks stay held until their last holder
      frees them, unreferenced cached blocks are evicted when space is needed, lookups are
      pure, stats count admitted lookups, and ``reset_prefix_cache`` refuses while blocks are held;
    - lookahead (when ``truncate`` is implemented): slots for draft tokens past the request's
      tokens, ``truncate`` gives back exactly the blocks past the kept tokens (shared blocks keep
      their other holders), refuses to drop computed tokens, and a block holding drafts, or the
      not yet computed token after them, is never offered.

    Prefix caching is optional: :attr:`prefix_caching` ``None`` runs those tests only if the
    manager reuses blocks at all with ``enable_prefix_caching=True``; ``True`` requires it.
    """

    kind = "kv_cache_manager"
    interface = KVCacheManager
    kv_cache_manager: ClassVar[str]
    """Registry name of the manager under test."""
    prefix_caching: ClassVar[bool | None] = None
    """True: the manager must implement prefix caching; False: skip those tests; None: detect."""

    def make(self, component: type, num_blocks: int = 33, prefix_caching: bool = False) -> KVCacheManager:
        """A fresh manager, constructed as the engine does (``num_blocks`` counts the null block)."""
        return component(num_blocks, BLOCK_SIZE, prefix_caching)

    @staticmethod
    def admit(manager: KVCacheManager, request: Request, num_new: int | None = None) -> int | None:
        """Admit ``request`` as the scheduler does; returns the cached tokens reused, or None if refused."""
        cached = manager.num_cached_tokens(request)
        request.num_computed_tokens = cached
        num_new = request.num_tokens - cached if num_new is None else num_new
        if not manager.allocate_slots(request, num_new, cached):
            request.num_computed_tokens = 0
            return None
        return cached

    @staticmethod
    def held_blocks(manager: KVCacheManager, requests: list[Request]) -> set[int]:
        """The distinct blocks in the tables of ``requests``."""
        return {block for r in requests for block in manager.block_table(r.request_id)}

    def assert_accounting(self, manager: KVCacheManager, holders: list[Request], when: str) -> None:
        """Free blocks plus those ``holders`` hold are every usable block, block 0 is never held,
        and ``stats()`` agrees."""
        held = self.held_blocks(manager, holders)
        usable = manager.num_blocks - 1
        assert 0 not in held, f"{when}: the null block 0 was handed out"
        assert manager.num_free_blocks() + len(held) == usable, (
            f"{when}: {manager.num_free_blocks()} free + {len(held)} held != {usable} usable blocks"
        )
        stats = manager.stats()
        assert (stats.num_blocks, stats.num_free_blocks) == (usable, manager.num_free_blocks()), (
            f"{when}: stats() reports {stats.num_blocks} blocks / {stats.num_free_blocks} free, "
            f"the manager {usable} / {manager.num_free_blocks()}"
        )

    # -- tests -----------------------------------------------------------------------------
    def test_fresh_manager_offers_every_block_but_the_null_block(self, component):
        """``num_blocks`` counts the null block: ``num_blocks - 1`` are free, usage is 0."""
        manager = self.make(component, num_blocks=9)
        self.assert_accounting(manager, [], "fresh manager")
        stats = manager.stats()
        assert stats.usage == 0.0 and (stats.prefix_queries, stats.prefix_hits) == (0, 0)

    def test_block_tables_cover_exactly_the_tokens(self, component):
        """A table holds ``ceil(tokens / block_size)`` distinct blocks, grows only at its end, and
        no two requests with different tokens share a block."""
        manager = self.make(component)
        requests = [make_request(f"r{i}", range(100 * i, 100 * i + n)) for i, n in enumerate([1, 4, 5, 9, 16])]
        for request in requests:
            assert self.admit(manager, request) == 0, "nothing can be cached yet"
            table = manager.block_table(request.request_id)
            assert len(table) == -(-request.num_tokens // BLOCK_SIZE) and len(set(table)) == len(table), (
                f"{request.num_tokens} tokens got block table {table} (block size {BLOCK_SIZE})"
            )
        self.assert_accounting(manager, requests, "after admitting 5 requests")
        tables = [manager.block_table(r.request_id) for r in requests]
        assert sum(map(len, tables)) == len(self.held_blocks(manager, requests)), f"tables overlap: {tables}"
        grower = requests[2]  # 5 tokens in 2 blocks
        for new_tokens, expected_blocks in [(3, 2), (1, 3), (8, 5)]:
            old = list(manager.block_table(grower.request_id))
            grower.num_computed_tokens = grower.num_tokens
            grower.prompt_token_ids += [7] * new_tokens
            assert manager.allocate_slots(grower, new_tokens)
            table = manager.block_table(grower.request_id)
            assert table[: len(old)] == old and len(table) == expected_blocks, (
                f"growing to {grower.num_tokens} tokens turned table {old} into {table}; "
                f"expected the same blocks followed by new ones, {expected_blocks} in all"
            )
        self.assert_accounting(manager, requests, "after growing a request")

    def test_refused_allocation_holds_nothing_new(self, component):
        """An allocation that does not fit returns False and changes nothing, for a new request
        and for a growing one; after frees, the same allocation succeeds."""
        manager = self.make(component, num_blocks=9)  # 8 usable
        a, b = make_request("a", range(20)), make_request("b", range(100, 116))
        assert self.admit(manager, a) == 0  # 5 blocks
        before = manager.num_free_blocks()
        assert self.admit(manager, b) is None, "16 tokens need 4 blocks, only 3 are free: must refuse"
        assert manager.num_free_blocks() == before, "a refused allocation kept some blocks"
        a.num_computed_tokens = a.num_tokens
        table = list(manager.block_table("a"))
        a.prompt_token_ids += [1] * 16
        assert not manager.allocate_slots(a, 16), "growing by 4 blocks with 3 free must be refused"
        assert manager.num_free_blocks() == before and manager.block_table("a") == table, (
            "a refused growth changed the free count or the block table"
        )
        self.assert_accounting(manager, [a], "after refusals")
        manager.free(a)
        assert self.admit(manager, b) is not None, "after freeing, the refused allocation must fit"
        self.assert_accounting(manager, [b], "after freeing and admitting again")

    def test_free_returns_every_block_and_is_idempotent(self, component):
        """``free`` returns all of a request's blocks; freeing again, or a request that holds no
        blocks (aborted while waiting), is a no-op."""
        manager = self.make(component)
        a = make_request("a", range(11))
        self.admit(manager, a)
        manager.free(a)
        self.assert_accounting(manager, [], "after free")
        manager.free(a)
        manager.free(make_request("never-admitted", range(5)))
        self.assert_accounting(manager, [], "after freeing twice and freeing a request without blocks")

    def test_random_operations_keep_exact_accounting(self, component, seed):
        """Random admissions, growth, frees and preemptions (free, then admit again from token 0)
        keep ``free + held == usable`` after every operation and end with every block free."""
        rng = random.Random(seed)
        manager = self.make(component, num_blocks=17)
        holders: list[Request] = []
        idle: list[Request] = [make_request(f"r{i}", range(50 * i, 50 * i + rng.randint(1, 12))) for i in range(8)]
        for step in range(200):
            op = rng.choice(["admit", "grow", "grow", "free", "preempt"])
            if op == "admit" and idle:
                request = idle.pop(rng.randrange(len(idle)))
                if self.admit(manager, request) is not None:
                    holders.append(request)
                else:
                    idle.append(request)
            elif holders:
                request = rng.choice(holders)
                if op == "grow":
                    request.num_computed_tokens = request.num_tokens
                    request.output_token_ids.append(rng.randrange(50))
                    manager.allocate_slots(request, 1)  # may be refused: the request keeps what it has
                else:
                    manager.free(request)
                    request.num_computed_tokens = 0
                    holders.remove(request)
                    idle.append(request)
            self.assert_accounting(manager, holders, f"operation {step} ({op})")
        for request in holders:
            manager.free(request)
        self.assert_accounting(manager, [], "after freeing everything")

    # -- lookahead: draft slots and truncate -------------------------------------------------
    @staticmethod
    def verify_drafts(manager: KVCacheManager, request: Request, drafts: list[int], accepted: list[int]) -> None:
        """A decode step with lookahead, as the scheduler runs it: slots for the last known token and
        ``drafts``; then ``accepted`` (accepted drafts and the token after them) appended, the
        computed count set to all but the last token, and the slots past it truncated."""
        assert request.num_computed_tokens == request.num_tokens - 1, "a decoding request"
        if not manager.allocate_slots(request, 1 + len(drafts)):
            raise AssertionError(f"{request.request_id}: no room for {len(drafts)} drafts")
        request.output_token_ids += accepted
        request.num_computed_tokens = request.num_tokens - 1
        try:
            manager.truncate(request, request.num_computed_tokens)
        except NotImplementedError:
            pytest.skip("the manager does not implement truncate (lookahead)")

    def decoding(self, manager: KVCacheManager, request_id: str, tokens: list[int] | range) -> Request:
        """A request admitted with prompt ``tokens[:-1]``, computed, and ``tokens[-1]`` sampled."""
        request = make_request(request_id, list(tokens)[:-1])
        assert self.admit(manager, request) is not None, f"{request_id} did not fit"
        request.num_computed_tokens = request.num_tokens
        request.output_token_ids.append(list(tokens)[-1])
        return request

    def test_truncate_gives_back_the_slots_of_rejected_drafts(self, component):
        """Slots for 5 drafts past a request's tokens, 1 accepted: ``truncate`` keeps exactly the
        blocks of the computed tokens, the table's head unchanged, every other block free again;
        truncating below the computed tokens is refused with ValueError."""
        manager = self.make(component, num_blocks=9)
        a = self.decoding(manager, "a", range(100, 107))  # 7 tokens, 6 computed
        assert manager.allocate_slots(a, 1 + 5), "the last token and 5 drafts: 12 tokens in 3 blocks"
        table = list(manager.block_table("a"))
        assert len(table) == 3, f"slots for 12 tokens in table {table}"
        a.output_token_ids += [107, 50]  # one draft accepted, then the token after it
        a.num_computed_tokens = a.num_tokens - 1
        try:
            manager.truncate(a, a.num_computed_tokens)
        except NotImplementedError:
            pytest.skip("the manager does not implement truncate (lookahead)")
        assert manager.block_table("a") == table[:2], (
            f"truncating to 8 tokens turned table {table} into {manager.block_table('a')}, expected {table[:2]}"
        )
        self.assert_accounting(manager, [a], "after truncating rejected drafts")
        with pytest.raises(ValueError):
            manager.truncate(a, a.num_computed_tokens - 1)
        assert manager.block_table("a") == table[:2], "a refused truncate changed the table"
        manager.free(a)
        self.assert_accounting(manager, [], "after freeing")

    def test_truncate_keeps_blocks_other_requests_share(self, caching_manager):
        """A request reusing another's cached prefix verifies drafts and truncates: the shared
        blocks keep both holders, and freeing both returns every block."""
        manager = caching_manager
        a = self.decoding(manager, "a", range(10))
        b = self.decoding(manager, "b", [*range(9), 60])
        assert manager.block_table("b")[:2] == manager.block_table("a")[:2], "b must reuse a's 8 cached tokens"
        self.verify_drafts(manager, b, [61, 62, 63, 64], [61, 70])
        assert manager.block_table("b")[:2] == manager.block_table("a")[:2]
        self.assert_accounting(manager, [a, b], "after b verified drafts")
        manager.free(a)
        self.assert_accounting(manager, [b], "after freeing a")
        manager.free(b)
        self.assert_accounting(manager, [], "after freeing both")

    def test_drafts_are_offered_only_once_accepted_and_computed(self, caching_manager):
        """A block holding draft tokens is never offered while they are drafts, nor one whose last
        token (sampled after the accepted drafts) has no KV yet, even after the request is freed;
        a block full of accepted, computed drafts is offered as if computed one token per step."""
        manager = caching_manager
        known = list(range(200, 208))  # 8 tokens: 2 blocks, the last token not computed yet
        drafts = [208, 209, 210, 211, 212]
        a = self.decoding(manager, "a", known)
        assert manager.allocate_slots(a, 1 + len(drafts))
        got = manager.num_cached_tokens(make_request("probe1", [*known, *drafts, 0]))
        assert got == 8, f"{got} tokens offered while tokens 8.. are drafts: only the 8 known ones may be"
        a.output_token_ids += [208, 209, 210, 211, 99]  # 4 drafts accepted, the fifth rejected
        a.num_computed_tokens = a.num_tokens - 1  # 12: tokens 0..11
        try:
            manager.truncate(a, a.num_computed_tokens)
        except NotImplementedError:
            pytest.skip("the manager does not implement truncate (lookahead)")
        got = manager.num_cached_tokens(make_request("probe2", [*known, 208, 209, 210, 211, 99, 0]))
        assert got == 12, f"{got} tokens offered after 4 drafts were accepted and computed, expected 12"
        got = manager.num_cached_tokens(make_request("probe3", [*known, *drafts, 0]))
        assert got == 12, f"the rejected draft 212 was offered: {got} cached tokens, expected 12"
        self.verify_drafts(manager, a, [100, 101, 102], [100, 101, 7])  # tokens 13..15: 101 computed, 7 not
        probe = [*a.token_ids(0, a.num_tokens), 0]
        for when in ("before its step is scheduled", "after the request ended"):
            got = manager.num_cached_tokens(make_request("probe4", probe))
            assert got == 12, (
                f"{got} tokens offered {when}, with tokens 12..15 computed but the last (sampled after "
                "the accepted drafts): a block whose last token has no KV must not be offered"
            )
            manager.free(a)

    def test_random_lookahead_keeps_exact_accounting(self, component, seed):
        """Random decodes verifying 0 to 4 drafts (each accepted or not), preemptions and frees keep
        ``free + held == usable`` after every operation and a table of ``ceil(computed / block_size)``
        blocks after every truncate."""
        rng = random.Random(seed)
        manager = self.make(component, num_blocks=17, prefix_caching=bool(seed % 2))
        holders: list[Request] = []
        for i in range(6):
            holders.append(self.decoding(manager, f"r{i}", range(50 * i, 50 * i + rng.randint(1, 9))))
        for step in range(150):
            if not holders:
                break
            request = rng.choice(holders)
            drafts = [rng.randrange(50) for _ in range(rng.randint(0, 4))]
            if rng.random() < 0.1 or not manager.allocate_slots(request, 1 + len(drafts)):
                manager.free(request)  # preempted: computed again up to its last token, from its cached prefix
                request.num_computed_tokens = 0
                cached = manager.num_cached_tokens(request)
                request.num_computed_tokens = cached
                if manager.allocate_slots(request, request.num_tokens - 1 - cached, cached):
                    request.num_computed_tokens = request.num_tokens - 1
                else:
                    holders.remove(request)
                self.assert_accounting(manager, holders, f"operation {step} (preempt)")
                continue
            kept = rng.randint(0, len(drafts))
            request.output_token_ids += [*drafts[:kept], rng.randrange(50)]
            request.num_computed_tokens = request.num_tokens - 1
            try:
                manager.truncate(request, request.num_computed_tokens)
            except NotImplementedError:
                pytest.skip("the manager does not implement truncate (lookahead)")
            table = manager.block_table(request.request_id)
            assert len(table) == -(-request.num_computed_tokens // BLOCK_SIZE), (
                f"operation {step}: {len(table)} blocks after truncating to {request.num_computed_tokens} tokens"
            )
            self.assert_accounting(manager, holders, f"operation {step} (verify {len(drafts)} drafts)")
        for request in holders:
            manager.free(request)
        self.assert_accounting(manager, [], "after freeing everything")

    # -- prefix caching and eviction --------------------------------------------------------
    # Generic rules of the KVCacheManager docstring. A manager with its own policy (eviction
    # order, hashing) tests that in its own files; add here only what every manager must do.

    @pytest.fixture
    def caching_manager(self, component) -> KVCacheManager:
        """A manager with prefix caching on (skips the test if the manager has none and may)."""
        if self.prefix_caching is False:
            pytest.skip("prefix caching not claimed (prefix_caching = False)")
        manager = self.make(component, prefix_caching=True)
        if self.prefix_caching is None:
            probe = self.make(component, prefix_caching=True)
            first = make_request("probe-a", range(9))
            self.admit(probe, first)
            first.num_computed_tokens = first.num_tokens
            probe.free(first)
            if probe.num_cached_tokens(make_request("probe-b", range(9))) == 0:
                pytest.skip("the manager caches no prefixes; set prefix_caching = True to require it")
        return manager

    def run_and_free(self, manager: KVCacheManager, request: Request) -> int:
        """Admit, compute the whole sequence, free; returns the cached tokens it reused."""
        cached = self.admit(manager, request)
        assert cached is not None, f"{request.request_id} did not fit"
        request.num_computed_tokens = request.num_tokens
        manager.free(request)
        return cached

    def test_computed_full_blocks_are_reused_and_the_last_token_recomputed(self, caching_manager):
        """After a request's KV is computed, a request with the same leading tokens reuses every
        full block of them, but never its own last token (whose logits must be computed)."""
        manager = caching_manager
        assert self.run_and_free(manager, make_request("a", range(10))) == 0
        for tokens, expected in [([*range(8), 99], 8), (range(8), 4), (range(10), 8), ([99, *range(1, 10)], 0)]:
            got = manager.num_cached_tokens(make_request("b", tokens))
            assert got == expected, (
                f"prompt {list(tokens)} after computing range(10): {got} cached tokens, expected {expected}"
            )

    def test_lookup_is_pure(self, caching_manager):
        """``num_cached_tokens`` reserves and counts nothing, however often it is called."""
        manager = caching_manager
        self.run_and_free(manager, make_request("a", range(9)))
        free, stats = manager.num_free_blocks(), manager.stats()
        for _ in range(3):
            assert manager.num_cached_tokens(make_request("b", range(9))) == 8
        assert manager.num_free_blocks() == free and manager.stats() == stats, "a lookup changed the manager"

    def test_blocks_never_computed_are_not_offered_after_their_request_is_freed(self, caching_manager):
        """A block may be offered once the step computing it is scheduled, but a request freed
        before computing it (preempted) must take it out of the offer; computed blocks stay."""
        manager = caching_manager
        a = make_request("a", range(9))
        assert self.admit(manager, a, num_new=5) == 0  # a first chunk fills block 0
        a.num_computed_tokens = 5
        assert manager.allocate_slots(a, 4)  # the second chunk would fill block 1
        manager.free(a)  # preempted before the second chunk ran
        got = manager.num_cached_tokens(make_request("b", range(9)))
        assert got == 4, f"after a request computed only its first block and was freed, {got} tokens are offered, not 4"

    def test_shared_blocks_stay_until_their_last_holder_frees_them(self, caching_manager):
        """Reused blocks get one more holder: freeing one holder returns only its own blocks."""
        manager = caching_manager
        a = make_request("a", range(10))
        self.admit(manager, a)
        a.num_computed_tokens = a.num_tokens
        a.output_token_ids.append(3)
        assert manager.allocate_slots(a, 1)  # the next step: the manager sees a's computed blocks
        b = make_request("b", [*range(8), 50, 51])
        assert self.admit(manager, b) == 8
        shared = manager.block_table("b")[:2]
        assert shared == manager.block_table("a")[:2], "the cached prefix must be a's blocks"
        self.assert_accounting(manager, [a, b], "two requests sharing two blocks")
        manager.free(a)
        self.assert_accounting(manager, [b], "after freeing one of the sharing requests")
        manager.free(b)
        self.assert_accounting(manager, [], "after freeing both")

    def test_cached_blocks_are_evicted_when_space_is_needed(self, caching_manager):
        """Cached blocks nobody holds count as free and are reused for new allocations; KV that
        was overwritten is never offered again."""
        manager = caching_manager
        usable = manager.num_blocks - 1
        self.run_and_free(manager, make_request("a", range(13)))
        assert manager.num_free_blocks() == usable, "cached blocks nobody holds must count as free"
        filler = make_request("fill", range(1000, 1000 + usable * BLOCK_SIZE))
        assert self.admit(manager, filler) == 0, "filling the whole cache must evict the cached blocks"
        assert manager.num_cached_tokens(make_request("a2", range(13))) == 0, "offered evicted KV"
        manager.free(filler)
        self.assert_accounting(manager, [], "after eviction")

    def test_cache_salt_separates_requests(self, caching_manager):
        """Requests with different ``cache_salt`` never share KV, even with the same tokens."""
        manager = caching_manager
        self.run_and_free(manager, make_request("a", range(9), salt="tenant-1"))
        assert manager.num_cached_tokens(make_request("b", range(9), salt="tenant-2")) == 0
        assert manager.num_cached_tokens(make_request("c", range(9), salt="tenant-1")) == 8

    def test_preempted_request_resumes_from_its_own_computed_blocks(self, caching_manager):
        """A request freed by preemption finds its computed blocks, output tokens included."""
        manager = caching_manager
        a = make_request("a", range(6))
        self.admit(manager, a)
        a.num_computed_tokens = a.num_tokens
        for token in (100, 101, 102):
            a.output_token_ids.append(token)
            assert manager.allocate_slots(a, 1)
            a.num_computed_tokens += 1
        manager.free(a)
        a.num_computed_tokens = 0
        assert manager.num_cached_tokens(a) == 8, "9 computed tokens: 2 full blocks must be found again"

    def test_stats_count_admitted_lookups(self, caching_manager):
        """``prefix_queries`` counts the tokens of admitted requests, ``prefix_hits`` those reused."""
        manager = caching_manager
        hits = [self.run_and_free(manager, make_request(f"r{i}", range(10))) for i in range(3)]
        stats = manager.stats()
        assert (stats.prefix_queries, stats.prefix_hits) == (30, sum(hits)) and sum(hits) == 16, (
            f"3 admissions of the same 10 tokens: stats {stats.prefix_queries} queried / {stats.prefix_hits} hit, "
            f"expected 30 / 16"
        )

    def test_reset_prefix_cache_only_when_nothing_is_held(self, caching_manager):
        """``reset_prefix_cache`` returns False while a request holds blocks; once all are free it
        forgets every cached block."""
        manager = caching_manager
        self.run_and_free(manager, make_request("a", range(9)))
        b = make_request("b", range(100, 105))
        self.admit(manager, b)
        assert manager.reset_prefix_cache() is False, "reset while a request holds blocks must refuse"
        assert manager.num_cached_tokens(make_request("c", range(9))) == 8, "a refused reset dropped cached blocks"
        manager.free(b)
        assert manager.reset_prefix_cache() is True
        assert manager.num_cached_tokens(make_request("d", range(9))) == 0, "reset kept cached blocks"
