"""A pool of fixed-size KV blocks with reference counts."""

from __future__ import annotations

from collections import deque

NULL_BLOCK = 0


class BlockPool:
    """Hands out block ids ``1 .. num_blocks-1``; block 0 is the null block used for padding.

    A block is free when its reference count is 0. Sharing a block (prefix caching, ``n > 1``)
    increments its count; it returns to the free queue when the last holder releases it.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be at least 2 (block 0 is reserved), got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(1, num_blocks))

    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> list[int] | None:
        """``count`` fresh blocks with reference count 1, or None (taking nothing) if too few are free."""
        if count > len(self._free):
            return None
        blocks = [self._free.popleft() for _ in range(count)]
        for block in blocks:
            self.ref_counts[block] = 1
        return blocks

    def share(self, block: int) -> None:
        """Add a holder to an allocated block."""
        if self.ref_counts[block] <= 0:
            raise ValueError(f"block {block} is not allocated")
        self.ref_counts[block] += 1

    def release(self, blocks: list[int]) -> None:
        """Drop one holder from each block; blocks nobody holds go back to the free queue."""
        for block in blocks:
            if self.ref_counts[block] <= 0:
                raise ValueError(f"block {block} released more often than allocated")
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self._free.append(block)
