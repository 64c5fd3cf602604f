"""The KVCacheManager interface: which physical KV blocks each request owns."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvserve.request import Request


@dataclass
class KVCacheStats:
    """A snapshot for logs and metrics."""

    num_blocks: int
    num_free_blocks: int
    prefix_queries: int = 0
    """Prompt tokens looked up in the prefix cache."""
    prefix_hits: int = 0
    """Of those, tokens found cached."""

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks if self.num_blocks else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0


class KVCacheManager(ABC):
    """Hands out fixed-size KV blocks to requests.

    Block 0 is the null block: it is never handed out and pads block tables. A request's
    block table is the list of block ids holding its tokens in order: token ``t`` lives in
    block ``table[t // block_size]`` at offset ``t % block_size``.
    """

    name: str

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False) -> None:
        """``num_blocks`` counts the null block, so ``num_blocks - 1`` are usable."""
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching

    @abstractmethod
    def num_cached_tokens(self, request: Request) -> int:
        """Tokens at the start of ``request`` whose KV is already cached (whole blocks only).

        A pure lookup: nothing is reserved until :meth:`allocate_slots`. Returns 0 when prefix
        caching is off, and never the whole sequence (the last token must be recomputed).
        """

    @abstractmethod
    def allocate_slots(self, request: Request, num_new_tokens: int, num_cached_tokens: int = 0) -> bool:
        """Make room for ``num_new_tokens`` more tokens of ``request``, all or nothing.

        On the first call for a request, ``num_cached_tokens`` (from :meth:`num_cached_tokens`)
        says how many leading tokens reuse cached blocks. Returns False, holding nothing new,
        when the free blocks do not suffice.
        """

    @abstractmethod
    def free(self, request: Request) -> None:
        """Release every block ``request`` holds (finished, aborted or preempted)."""

    @abstractmethod
    def block_table(self, request_id: str) -> list[int]:
        """The physical block ids of ``request_id``, in token order."""

    @abstractmethod
    def num_free_blocks(self) -> int:
        """Blocks that an allocation could use now (free or evictable)."""

    @abstractmethod
    def stats(self) -> KVCacheStats:
        """Counts for logging and metrics."""

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block not in use; returns False if some are still referenced."""
        return True
