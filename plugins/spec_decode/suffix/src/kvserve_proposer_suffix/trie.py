"""A suffix trie of bounded depth: every run of at most ``max_depth`` consecutive tokens of the
sequences added, each with how often it occurs, so the continuations of a context's suffix and
their frequencies are one walk away.

It stands in for Arctic Inference's path-compressed suffix tree: with the depth bounded (24 by
default) a plain trie holds at most ``max_depth`` nodes per token added, grows by ``O(max_depth)``
work per token, and a whole sequence can be taken out again (the global cache's eviction).
"""

from __future__ import annotations

from collections.abc import Sequence


class Node:
    """One run of tokens: how many times it occurs, and the runs one token longer."""

    __slots__ = ("count", "children")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, Node] = {}


class SuffixTrie:
    """Runs of at most ``max_depth`` tokens of the sequences added, counted.

    A sequence grows by :meth:`extend` (the request's tokens, as they are accepted) until
    :meth:`end_sequence`; :meth:`remove` takes a whole sequence added earlier out again.
    Invariant: a node's count is the number of places its run occurs in the sequences held, so a
    child's count over its parent's is the share of those places the child's token follows.
    """

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.root = Node()
        self.num_nodes = 0
        self._open: list[Node] = []
        """The nodes of the current sequence's last runs that can still grow (shorter than max_depth)."""

    def extend(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to the current sequence: each run ending at a new token is counted once."""
        for token in tokens:
            grown = []
            for node in (*self._open, self.root):
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = Node()
                    self.num_nodes += 1
                child.count += 1
                grown.append(child)
            # The runs ending here, longest first; one of max_depth tokens cannot grow further.
            self._open = grown[1:] if len(grown) == self.max_depth else grown

    def end_sequence(self) -> None:
        """The next :meth:`extend` starts a new sequence (no run spans the two)."""
        self._open = []

    def remove(self, tokens: Sequence[int]) -> None:
        """Take out a whole sequence added earlier (by :meth:`extend`, then :meth:`end_sequence`):
        every run of it is counted once less, and runs that no longer occur are dropped."""
        for start in range(len(tokens)):
            node = self.root
            for token in tokens[start : start + self.max_depth]:
                child = node.children[token]
                child.count -= 1
                if child.count == 0:
                    # Every longer run through it occurs only here too: the whole branch goes.
                    self.num_nodes -= _size(child)
                    del node.children[token]
                    break
                node = child

    def longest_match(self, context: Sequence[int]) -> tuple[Node, int]:
        """The node of the longest suffix of ``context`` (at most ``max_depth - 1`` tokens, so that
        something can follow) that occurs with a continuation, and its length; the root and 0 if none."""
        for length in range(min(len(context), self.max_depth - 1), 0, -1):
            node = self.root
            for token in context[len(context) - length :]:
                node = node.children.get(token)
                if node is None:
                    break
            if node is not None and node.children:
                return node, length
        return self.root, 0

    @staticmethod
    def draft(node: Node, max_tokens: int, min_token_prob: float) -> tuple[list[int], float]:
        """From ``node``, follow the most frequent continuation (ties: the smaller id) while the
        product of the shares taken stays at least ``min_token_prob``, for at most ``max_tokens``
        tokens; the tokens and their score, the sum of those products (the expected number accepted)."""
        tokens: list[int] = []
        prob = score = 1.0
        while len(tokens) < max_tokens and node.children:
            token, child = max(node.children.items(), key=lambda item: (item[1].count, -item[0]))
            prob *= child.count / node.count
            if prob < min_token_prob:
                break
            tokens.append(token)
            score += prob
            node = child
        return tokens, score - 1.0


def _size(node: Node) -> int:
    """Nodes in the branch under and including ``node``."""
    size, stack = 0, [node]
    while stack:
        current = stack.pop()
        size += 1
        stack.extend(current.children.values())
    return size
