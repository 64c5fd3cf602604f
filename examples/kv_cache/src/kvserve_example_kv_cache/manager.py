"""A KV cache manager without prefix caching: a stack of free blocks and a table per request."""

from __future__ import annotations

from kvserve.interfaces import KVCacheManager, KVCacheStats
from kvserve.request import Request


class FreeListKVCacheManager(KVCacheManager):
    """Blocks ``1 .. num_blocks-1`` start free; the most recently freed block is reused first."""

    name = "free_list"

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching)  # prefix caching is not offered
        self.free_blocks = list(range(num_blocks - 1, 0, -1))  # block 0 is the null block
        self.tables: dict[str, list[int]] = {}

    def num_cached_tokens(self, request: Request) -> int:
        return 0

    def allocate_slots(self, request: Request, num_new_tokens: int, num_cached_tokens: int = 0) -> bool:
        table = self.tables.get(request.request_id, [])
        needed = -(-(request.num_computed_tokens + num_new_tokens) // self.block_size) - len(table)
        if needed > len(self.free_blocks):
            return False  # all or nothing: nothing was taken
        self.tables[request.request_id] = table + [self.free_blocks.pop() for _ in range(max(needed, 0))]
        return True

    def truncate(self, request: Request, num_tokens: int) -> None:
        table = self.tables[request.request_id]
        if not request.num_computed_tokens <= num_tokens <= len(table) * self.block_size:
            raise ValueError(
                f"truncate: request {request.request_id!r} to {num_tokens} tokens, but it has "
                f"{request.num_computed_tokens} computed tokens and slots for {len(table) * self.block_size}"
            )
        keep = -(-num_tokens // self.block_size)
        self.free_blocks += table[keep:]
        self.tables[request.request_id] = table[:keep]

    def free(self, request: Request) -> None:
        self.free_blocks += self.tables.pop(request.request_id, [])

    def block_table(self, request_id: str) -> list[int]:
        return self.tables[request_id]

    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def stats(self) -> KVCacheStats:
        return KVCacheStats(num_blocks=self.num_blocks - 1, num_free_blocks=len(self.free_blocks))
