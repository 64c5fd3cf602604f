"""The default KVCacheManager: one block table per request over a shared BlockPool."""

from __future__ import annotations

from kvserve.interfaces.kv_cache import KVCacheManager, KVCacheStats
from kvserve.kv_cache.block_pool import BlockPool
from kvserve.request import Request


class PagedKVCacheManager(KVCacheManager):
    name = "paged"

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching)
        self.pool = BlockPool(num_blocks)
        self.tables: dict[str, list[int]] = {}

    def num_cached_tokens(self, request: Request) -> int:
        return 0  # prefix caching plugs in here

    def allocate_slots(self, request: Request, num_new_tokens: int, num_cached_tokens: int = 0) -> bool:
        table = self.tables.get(request.request_id, [])
        needed = -(-(request.num_computed_tokens + num_new_tokens) // self.block_size) - len(table)
        if needed <= 0:
            self.tables[request.request_id] = table
            return True
        blocks = self.pool.allocate(needed)
        if blocks is None:
            return False
        self.tables[request.request_id] = table + blocks
        return True

    def free(self, request: Request) -> None:
        # Release tail first so that, once prefix caching keeps freed blocks, the shared
        # head of a chain is the last to be evicted.
        self.pool.release(self.tables.pop(request.request_id, [])[::-1])

    def block_table(self, request_id: str) -> list[int]:
        return self.tables[request_id]

    def num_free_blocks(self) -> int:
        return self.pool.num_free()

    def stats(self) -> KVCacheStats:
        return KVCacheStats(num_blocks=self.num_blocks - 1, num_free_blocks=self.pool.num_free())
