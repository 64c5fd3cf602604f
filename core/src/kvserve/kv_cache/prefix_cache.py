"""The prefix cache: full KV blocks found again by a hash chained over the tokens before them.

It only indexes blocks; which blocks are free, and in what order they are reused (and so
evicted), is the block pool's business. A block's hash covers its parent's hash, its own
token ids and extra keys (e.g. a per-request cache salt), so equal hashes mean equal
prefixes, barring collisions. Collisions are harmless: a lookup accepts an entry only if
its tokens, its extra keys and its parent entry (by identity) are the ones asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

ExtraKeys = tuple[Hashable, ...]
BlockHashFn = Callable[[int | None, tuple[int, ...], ExtraKeys], int]
"""``(parent block hash or None for a first block, the block's token ids, extra keys) -> hash``."""


def hash_block_tokens(parent_hash: int | None, token_ids: tuple[int, ...], extra_keys: ExtraKeys) -> int:
    """Python's tuple hash: fast, and since lookups verify, a collision costs a miss, never wrong KV."""
    return hash((parent_hash, token_ids, extra_keys))


@dataclass(eq=False)
class CachedBlock:
    """A registered full block and what a lookup checks before reusing it."""

    block_id: int
    block_hash: int
    parent: CachedBlock | None
    """The entry of the block before it; None for a sequence's first block."""
    token_ids: tuple[int, ...]
    extra_keys: ExtraKeys

    def holds(self, parent: CachedBlock | None, token_ids: tuple[int, ...], extra_keys: ExtraKeys) -> bool:
        return self.parent is parent and self.token_ids == token_ids and self.extra_keys == extra_keys


class PrefixCache:
    """Registered full blocks by chained hash; at most one block per hash."""

    def __init__(self, hash_fn: BlockHashFn = hash_block_tokens) -> None:
        self.hash_fn = hash_fn
        self._by_hash: dict[int, CachedBlock] = {}
        self._by_block: dict[int, CachedBlock] = {}

    def __len__(self) -> int:
        return len(self._by_block)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._by_block

    def match(self, blocks: Iterable[tuple[int, ...]], extra_keys: ExtraKeys) -> list[CachedBlock]:
        """The entries of the longest cached prefix of ``blocks`` (each a full block's token ids)."""
        chain: list[CachedBlock] = []
        for token_ids in blocks:
            parent = chain[-1] if chain else None
            entry = self._by_hash.get(self._hash(parent, token_ids, extra_keys))
            if entry is None or not entry.holds(parent, token_ids, extra_keys):
                break
            chain.append(entry)
        return chain

    def insert(
        self, block_id: int, parent: CachedBlock | None, token_ids: tuple[int, ...], extra_keys: ExtraKeys
    ) -> CachedBlock | None:
        """Register ``block_id`` as holding ``token_ids`` right after ``parent``'s block.

        Returns its entry (the existing one if this block is already registered so), or None
        when the hash belongs to another block: the same tokens computed in parallel elsewhere,
        or a collision. The block then stays unregistered, and so must every block after it
        in that sequence, as they would have no parent entry to chain to.
        """
        block_hash = self._hash(parent, token_ids, extra_keys)
        existing = self._by_hash.get(block_hash)
        if existing is not None:
            same = existing.block_id == block_id and existing.holds(parent, token_ids, extra_keys)
            return existing if same else None
        entry = CachedBlock(block_id, block_hash, parent, token_ids, extra_keys)
        self._by_hash[block_hash] = self._by_block[block_id] = entry
        return entry

    def evict(self, block_id: int) -> None:
        """Forget ``block_id`` (about to be overwritten), if registered."""
        entry = self._by_block.pop(block_id, None)
        if entry is not None:
            del self._by_hash[entry.block_hash]

    def clear(self) -> None:
        self._by_hash.clear()
        self._by_block.clear()

    def _hash(self, parent: CachedBlock | None, token_ids: tuple[int, ...], extra_keys: ExtraKeys) -> int:
        return self.hash_fn(parent.block_hash if parent else None, token_ids, extra_keys)
