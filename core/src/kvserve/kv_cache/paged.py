"""The default KVCacheManager: one block table per request over a shared BlockPool, plus a prefix cache."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from kvserve.interfaces.kv_cache import KVCacheManager, KVCacheStats
from kvserve.kv_cache.block_pool import BlockPool
from kvserve.kv_cache.prefix_cache import BlockHashFn, CachedBlock, ExtraKeys, PrefixCache, hash_block_tokens
from kvserve.request import Request


@dataclass
class _Chain:
    """How far a request's full blocks are registered: ``entries[i]`` is the cache entry of its block ``i``."""

    entries: list[CachedBlock] = field(default_factory=list)
    closed: bool = False
    """Set when a block could not be registered; the blocks after it cannot be either."""


class PagedKVCacheManager(KVCacheManager):
    """Blocks are freed tail first, so the pool reuses (evicts) the end of a cached chain
    before its shared head; a block is registered in the prefix cache when the step that
    fills it is scheduled, or, filled by accepted drafts, when they are accepted
    (:meth:`truncate`). ``hash_fn`` is injectable so tests can force collisions."""

    name = "paged"

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = False,
        *,
        hash_fn: BlockHashFn = hash_block_tokens,
    ) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching)
        self.pool = BlockPool(num_blocks)
        self.prefix_cache = PrefixCache(hash_fn)
        self.tables: dict[str, list[int]] = {}
        self._chains: dict[str, _Chain] = {}
        self._queries = 0
        self._hits = 0

    def num_cached_tokens(self, request: Request) -> int:
        return len(self._lookup(request)) * self.block_size

    def allocate_slots(self, request: Request, num_new_tokens: int, num_cached_tokens: int = 0) -> bool:
        request_id = request.request_id
        admitting = request_id not in self.tables
        if admitting:
            hits = self._lookup(request)[: num_cached_tokens // self.block_size]
            if len(hits) * self.block_size != num_cached_tokens:
                raise ValueError(
                    f"num_cached_tokens: {num_cached_tokens} for request {request_id!r}, but "
                    f"{len(hits) * self.block_size} tokens are cached in whole blocks"
                )
            table = [entry.block_id for entry in hits]
        else:
            hits, table = [], self.tables[request_id]
        needed = -(-(request.num_computed_tokens + num_new_tokens) // self.block_size) - len(table)
        # Cached blocks nobody holds sit in the free queue: reusing them leaves fewer to allocate.
        reused = sum(1 for entry in hits if self.pool.ref_counts[entry.block_id] == 0)
        if needed > self.pool.num_free() - reused:
            return False
        for entry in hits:
            self.pool.share(entry.block_id)
        self.tables[request_id] = table + self._take(max(needed, 0))
        if admitting:
            self._chains[request_id] = _Chain(hits)
            if self._looks_up(request):
                self._queries += request.num_tokens
                self._hits += num_cached_tokens
        # Lookahead tokens past the request's known ones are not registered: they are guesses.
        self._register_full_blocks(request, min(request.num_computed_tokens + num_new_tokens, request.num_tokens))
        return True

    def truncate(self, request: Request, num_tokens: int) -> None:
        request_id = request.request_id
        table = self.tables.get(request_id)
        if table is None:
            raise ValueError(f"truncate: request {request_id!r} holds no blocks")
        if not request.num_computed_tokens <= num_tokens <= len(table) * self.block_size:
            raise ValueError(
                f"truncate: request {request_id!r} to {num_tokens} tokens, but it has "
                f"{request.num_computed_tokens} computed tokens (never dropped) and slots for "
                f"{len(table) * self.block_size}"
            )
        keep = -(-num_tokens // self.block_size)
        # The released blocks hold only drafts' KV past the computed tokens: never registered.
        self.pool.release(table[keep:][::-1])
        self.tables[request_id] = table[:keep]
        self._register_full_blocks(request, min(request.num_computed_tokens, request.num_tokens))

    def free(self, request: Request) -> None:
        if request.request_id not in self.tables:
            return
        # Blocks registered for a step that will not run (the request was preempted after being
        # scheduled) never get their KV: stop offering them.
        for entry in self._chains.pop(request.request_id).entries[request.num_computed_tokens // self.block_size :]:
            if self.pool.ref_counts[entry.block_id] > 1:
                raise RuntimeError(
                    f"request {request.request_id!r} freed in the step that computes block {entry.block_id}, "
                    "which another request reuses: a scheduler must not preempt after its first admission of a step"
                )
            self.prefix_cache.evict(entry.block_id)
        # Tail first: the pool reuses the earliest freed, so the end of a chain is evicted
        # before the head other prompts are likelier to share.
        self.pool.release(self.tables.pop(request.request_id)[::-1])

    def block_table(self, request_id: str) -> list[int]:
        return self.tables[request_id]

    def num_free_blocks(self) -> int:
        return self.pool.num_free()

    def stats(self) -> KVCacheStats:
        return KVCacheStats(
            num_blocks=self.num_blocks - 1,
            num_free_blocks=self.pool.num_free(),
            prefix_queries=self._queries,
            prefix_hits=self._hits,
        )

    def reset_prefix_cache(self) -> bool:
        if self.pool.num_free() < self.num_blocks - 1:
            return False
        self.prefix_cache.clear()
        return True

    # -- helpers --------------------------------------------------------------------------
    def _take(self, count: int) -> list[int]:
        """``count`` fresh blocks (the caller checked they are free); any cached KV in them is forgotten."""
        blocks = self.pool.allocate(count)
        assert blocks is not None, "caller checked the free count"
        for block in blocks:
            self.prefix_cache.evict(block)
        return blocks

    def _looks_up(self, request: Request) -> bool:
        # Prompt logprobs need logits at every prompt position, so such a request computes them all.
        return self.enable_prefix_caching and request.sampling_params.prompt_logprobs is None

    def _lookup(self, request: Request) -> list[CachedBlock]:
        if not self._looks_up(request):
            return []
        # Stop before the last token: it is always recomputed so that its logits exist.
        return self.prefix_cache.match(self._full_blocks(request, request.num_tokens - 1), self._extra_keys(request))

    def _register_full_blocks(self, request: Request, num_tokens: int) -> None:
        """Register the request's blocks that its first ``num_tokens`` tokens (all known) fill.

        Called as soon as they are scheduled: a request admitted later in the same step may
        reuse them, since the runner writes every scheduled token's KV into a layer before
        that layer's attention reads it. Accepted drafts are known only after their step:
        :meth:`truncate` registers their blocks then.
        """
        chain = self._chains[request.request_id]
        if not self.enable_prefix_caching or chain.closed:
            return
        table = self.tables[request.request_id]
        extra_keys = self._extra_keys(request)
        num_done = len(chain.entries) * self.block_size
        for token_ids in self._full_blocks(request, num_tokens, num_done):
            parent = chain.entries[-1] if chain.entries else None
            entry = self.prefix_cache.insert(table[len(chain.entries)], parent, token_ids, extra_keys)
            if entry is None:
                chain.closed = True
                return
            chain.entries.append(entry)

    def _full_blocks(self, request: Request, num_tokens: int, start: int = 0) -> Iterator[tuple[int, ...]]:
        """Token ids of each full block within the first ``num_tokens`` tokens, from token ``start``."""
        for begin in range(start, num_tokens - self.block_size + 1, self.block_size):
            yield tuple(request.token_ids(begin, begin + self.block_size))

    @staticmethod
    def _extra_keys(request: Request) -> ExtraKeys:
        """What besides the tokens must match for KV to be shared: the salt, and the LoRA adapter (its KV
        differs from the base model's and every other adapter's for the same tokens)."""
        salt = () if request.cache_salt is None else (request.cache_salt,)
        return salt if request.lora_request is None else (*salt, request.lora_request)
