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
    """Usable blocks (the null block excluded)."""
    num_free_blocks: int
    """Blocks not held by any request, cached ones included."""
    prefix_queries: int = 0
    """Tokens looked up in the prefix cache when requests were admitted (prompt, plus the
    output so far of a request resumed after preemption)."""
    prefix_hits: int = 0
    """Of those, tokens whose cached KV was reused."""

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

    With prefix caching, a full block may be handed to other requests whose tokens up to the
    end of that block are the same (and whose extra keys, such as ``Request.cache_salt``,
    match), and it stays cached after its holders free it, until its space is needed. A block
    may be offered as soon as the step that computes its KV is scheduled: the runner writes
    every scheduled token's KV into a layer before that layer's attention reads it, so a
    request admitted in the same step can already reuse it. That holds only if the step
    keeps the request computing the block, so schedulers do all of a step's preemptions
    before its first admission, and the manager stops offering a block whose request is
    freed before computing it (``request.num_computed_tokens`` tells which tokens are done).

    Lookahead (speculative decoding): slots may be allocated past ``request.num_tokens`` for
    draft tokens. Those are guesses, not the request's tokens, so a block holding any of them
    is never offered, however full: only once the drafts are accepted (appended to the request,
    and counted in ``num_computed_tokens`` by the scheduler's update) does :meth:`truncate`
    offer the blocks they fill, and it gives back the slots of the rejected ones.

    Sliding windows: a block whose tokens all lie ``sliding_window`` or more positions behind
    a request's next token is never read again by a sliding layer (attention backends never
    read keys outside a layer's window, whatever the table holds there). Whether to free it
    is this manager's decision, as it alone owns the tables; one that does keeps the table's
    length (positions index it) and puts the null block 0 in the freed entries. The default
    paged manager keeps such blocks for now: all layers share one table, so a block could go
    only when every layer slides (Mistral; not Qwen2 past ``max_window_layers`` nor Gemma 3's
    global layers, which need a table per layer group, as vLLM's hybrid allocator keeps); the
    manager is not told the windows; and the prefix cache's hash chains need every block of
    a prefix.
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

        ``request`` holds no blocks yet (new, or preempted). A pure lookup: nothing is reserved
        or counted until :meth:`allocate_slots`. Returns 0 when prefix caching is off or the
        request asks for prompt logprobs (every prompt position needs logits), and never the
        whole sequence (the last token must be recomputed so that its logits exist).
        """

    @abstractmethod
    def allocate_slots(self, request: Request, num_new_tokens: int, num_cached_tokens: int = 0) -> bool:
        """Make room for KV of tokens up to ``request.num_computed_tokens + num_new_tokens``, all or nothing.

        On the first call for a request (it holds no blocks), ``num_cached_tokens`` is the
        value :meth:`num_cached_tokens` returned in the same scheduling pass, and the scheduler
        has set ``request.num_computed_tokens`` to it: those leading tokens reuse the cached
        blocks (one more holder each) and count as prefix cache hits. Returns False, holding
        nothing new, when the free blocks do not suffice.

        ``request.num_computed_tokens + num_new_tokens`` may exceed ``request.num_tokens``: the
        tokens past it are lookahead (draft) tokens, which get slots but are never offered to
        other requests (see the class docstring and :meth:`truncate`).
        """

    def truncate(self, request: Request, num_tokens: int) -> None:
        """Keep slots for ``request``'s first ``num_tokens`` tokens only, after a step with lookahead.

        Called by the scheduler's update once it has appended the accepted tokens and set
        ``request.num_computed_tokens`` (``<= num_tokens``, else ValueError: computed KV, which
        other requests may share, is never dropped). The blocks past the first
        ``ceil(num_tokens / block_size)`` are released (one holder less each: the slots of
        rejected drafts), and the full blocks of computed, now known tokens (the accepted
        drafts) become offered exactly as if they had been computed one token per step.
        Managers that do not support lookahead keep this default, which raises
        NotImplementedError.
        """
        raise NotImplementedError(f"KV cache manager {self.name!r} cannot truncate requests (lookahead)")

    @abstractmethod
    def free(self, request: Request) -> None:
        """Release every block ``request`` holds (finished, aborted or preempted); no-op if it holds none.

        Called before ``request.num_computed_tokens`` is reset: blocks holding computed tokens
        stay cached for later requests, blocks this step was to fill (a request preempted after
        being scheduled) are no longer offered.
        """

    @abstractmethod
    def block_table(self, request_id: str) -> list[int]:
        """The physical block ids of ``request_id``, in token order."""

    @abstractmethod
    def num_free_blocks(self) -> int:
        """Blocks that an allocation could use now (free or evictable)."""

    @abstractmethod
    def stats(self) -> KVCacheStats:
        """Counts for logging and metrics; the prefix counters only grow."""

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, e.g. after the weights changed.

        Only possible while no request holds blocks: returns False, changing nothing,
        otherwise. Managers without a prefix cache keep this default, which returns True.
        """
        return True
