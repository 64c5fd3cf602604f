"""A pool of fixed-size KV blocks with reference counts and a least-recently-freed queue."""

from __future__ import annotations

from collections import OrderedDict

NULL_BLOCK = 0


class BlockPool:
    """Hands out block ids ``1 .. num_blocks-1``; block 0 is the null block used for padding.

    A block is free when its reference count is 0. Sharing a block (prefix caching)
    increments its count; it joins the back of the free queue when the last holder releases it.
    Allocation takes blocks from the front, so the block freed longest ago is reused first:
    a free block may still hold KV worth reusing (a prefix cache hit takes it back with
    :meth:`share`), and this order makes reuse evict the least recently used one.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be at least 2 (block 0 is reserved), got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))

    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> list[int] | None:
        """``count`` blocks with reference count 1, taken from the front of the free queue,
        or None (taking nothing) if too few are free."""
        if count > len(self._free):
            return None
        blocks = [self._free.popitem(last=False)[0] for _ in range(count)]
        for block in blocks:
            self.ref_counts[block] = 1
        return blocks

    def share(self, block: int) -> None:
        """Add a holder to a block; a free block (one whose KV is reused) leaves the free queue."""
        if self.ref_counts[block] == 0:
            del self._free[block]
        self.ref_counts[block] += 1

    def release(self, blocks: list[int]) -> None:
        """Drop one holder from each block, in order; blocks nobody holds join the back of the free queue."""
        for block in blocks:
            if self.ref_counts[block] <= 0:
                raise ValueError(f"block {block} released more often than allocated")
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self._free[block] = None
