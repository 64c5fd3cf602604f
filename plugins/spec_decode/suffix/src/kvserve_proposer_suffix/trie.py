"""A suffix trie of bounded depth: every run of at most ``max_depth`` consecutive tokens of the
sequences added, each with how often it occurs, so the continuations of a context's suffix and
their frequencies are one walk away.

It stands in for Arctic Inference's path-compressed suffix tree: with the depth bounded (24 by
default) a plain trie holds at most ``max_depth`` nodes per token added, grows by ``O(max_depth)``
work per token, and a whole sequence can be taken out again (the global cache's eviction).

Nodes are integer ids into flat lists (a count and a ``token -> child id`` dict each), not objects:
dicts of ints are invisible to Python's cyclic garbage collector, while a trie of node objects (tens
of thousands per batch of requests) made each of its full passes walk them all, which cost a batch
of 32 chat requests more than 10% of its decoding time.
"""

from __future__ import annotations

from collections.abc import Sequence

ROOT = 0
"""The id of the root: the empty run."""


class SuffixTrie:
    """Runs of at most ``max_depth`` tokens of the sequences added, counted.

    A sequence grows by :meth:`extend` (the request's tokens, as they are accepted) until
    :meth:`end_sequence`; :meth:`remove` takes a whole sequence added earlier out again.
    Invariant: a node's count is the number of places its run occurs in the sequences held, so a
    child's count over its parent's is the share of those places the child's token follows.
    """

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.counts: list[int] = [0]
        """Node id -> how many places its run occurs."""
        self.children: list[dict[int, int]] = [{}]
        """Node id -> the runs one token longer: token -> child id."""
        self.num_nodes = 0
        """Nodes held, the root not counted."""
        self._free: list[int] = []
        """Ids of removed nodes, reused first."""
        self._open: list[int] = []
        """The nodes of the current sequence's last runs that can still grow (shorter than
        max_depth), longest first."""

    def extend(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to the current sequence: each run ending at a new token is counted once."""
        counts, children, open_nodes, max_depth = self.counts, self.children, self._open, self.max_depth
        for token in tokens:
            grown = []
            for node in (*open_nodes, ROOT):
                child = children[node].get(token)
                if child is None:
                    child = children[node][token] = self._new_node()
                counts[child] += 1
                grown.append(child)
            # The runs ending here, longest first; one of max_depth tokens cannot grow further.
            open_nodes = grown[1:] if len(grown) == max_depth else grown
        self._open = open_nodes

    def end_sequence(self) -> None:
        """The next :meth:`extend` starts a new sequence (no run spans the two)."""
        self._open = []

    def remove(self, tokens: Sequence[int]) -> None:
        """Take out a whole sequence added earlier (by :meth:`extend`, then :meth:`end_sequence`):
        every run of it is counted once less, and runs that no longer occur are dropped."""
        for start in range(len(tokens)):
            node = ROOT
            for token in tokens[start : start + self.max_depth]:
                child = self.children[node][token]
                self.counts[child] -= 1
                if self.counts[child] == 0:
                    # Every longer run through it occurs only here too: the whole branch goes.
                    del self.children[node][token]
                    self._free_branch(child)
                    break
                node = child

    def longest_match(self, context: Sequence[int]) -> tuple[int, int]:
        """The node of the longest suffix of ``context`` (at most ``max_depth - 1`` tokens, so that
        something can follow) that occurs with a continuation, and its length; the root and 0 if none."""
        for length in range(min(len(context), self.max_depth - 1), 0, -1):
            node: int | None = ROOT
            for token in context[len(context) - length :]:
                node = self.children[node].get(token)
                if node is None:
                    break
            if node is not None and self.children[node]:
                return node, length
        return ROOT, 0

    def longest_open_match(self) -> tuple[int, int]:
        """:meth:`longest_match` of the current sequence's own tokens, without walking: the runs ending
        at its last token are the open nodes (longest first, each under ``max_depth`` tokens)."""
        for index, node in enumerate(self._open):
            if self.children[node]:
                return node, len(self._open) - index
        return ROOT, 0

    def draft(self, node: int, max_tokens: int, min_token_prob: float) -> tuple[list[int], float]:
        """From ``node``, follow the most frequent continuation (ties: the smaller id) while the
        product of the shares taken stays at least ``min_token_prob``, for at most ``max_tokens``
        tokens; the tokens and their score, the sum of those products (the expected number accepted)."""
        tokens: list[int] = []
        prob = score = 1.0
        while len(tokens) < max_tokens and self.children[node]:
            token, child = max(self.children[node].items(), key=lambda item: (self.counts[item[1]], -item[0]))
            prob *= self.counts[child] / self.counts[node]
            if prob < min_token_prob:
                break
            tokens.append(token)
            score += prob
            node = child
        return tokens, score - 1.0

    def _new_node(self) -> int:
        self.num_nodes += 1
        if self._free:
            return self._free.pop()
        self.counts.append(0)
        self.children.append({})
        return len(self.counts) - 1

    def _free_branch(self, node: int) -> None:
        """Release ``node`` and every node under it (already unlinked from its parent)."""
        stack = [node]
        while stack:
            current = stack.pop()
            stack.extend(self.children[current].values())
            self.children[current] = {}
            self.counts[current] = 0
            self._free.append(current)
            self.num_nodes -= 1
