"""The suffix trie against a brute-force count of runs: grown token by token or in chunks, sequences
taken out again, memory bounded by depth x tokens."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from kvserve_proposer_suffix.trie import ROOT, SuffixTrie


def runs(sequences: list[list[int]], depth: int) -> Counter:
    """Every run of at most ``depth`` consecutive tokens of each sequence, counted."""
    counts: Counter = Counter()
    for tokens in sequences:
        for start in range(len(tokens)):
            for end in range(start + 1, min(start + depth, len(tokens)) + 1):
                counts[tuple(tokens[start:end])] += 1
    return counts


def held(trie: SuffixTrie) -> Counter:
    """The runs the trie holds, with their counts."""
    counts: Counter = Counter()
    stack = [((), ROOT)]
    while stack:
        run, node = stack.pop()
        for token, child in trie.children[node].items():
            assert trie.counts[child] > 0, f"a run of count {trie.counts[child]} was kept: {run + (token,)}"
            counts[run + (token,)] = trie.counts[child]
            stack.append((run + (token,), child))
    return counts


def random_sequence(rng: random.Random) -> list[int]:
    phrase = [rng.randrange(6) for _ in range(rng.randint(1, 5))]
    return [t if rng.random() < 0.8 else rng.randrange(6) for t in phrase * rng.randint(1, 8)]


@pytest.mark.parametrize("depth", [2, 3, 7])
def test_runs_are_counted_exactly_however_the_tokens_arrive(depth):
    rng = random.Random(depth)
    trie, sequences = SuffixTrie(depth), []
    for _ in range(6):
        tokens = random_sequence(rng)
        at = 0
        while at < len(tokens):  # arrives in chunks, as accepted drafts do
            step = rng.randint(1, 4)
            trie.extend(tokens[at : at + step])
            at += step
        trie.end_sequence()
        sequences.append(tokens)
        expected = runs(sequences, depth)
        assert held(trie) == expected
        assert trie.num_nodes == len(expected) <= depth * sum(map(len, sequences))


@pytest.mark.parametrize("depth", [2, 5])
def test_removing_a_sequence_leaves_exactly_the_others(depth):
    rng = random.Random(10 + depth)
    sequences = [random_sequence(rng) for _ in range(8)]
    trie = SuffixTrie(depth)
    for tokens in sequences:
        trie.extend(tokens)
        trie.end_sequence()
    for i in rng.sample(range(len(sequences)), len(sequences)):
        trie.remove(sequences[i])
        sequences[i] = []
        expected = runs(sequences, depth)
        assert held(trie) == expected and trie.num_nodes == len(expected)
    assert trie.num_nodes == 0 and not trie.children[ROOT]


def test_longest_match_has_a_continuation_and_the_draft_follows_the_most_frequent_one():
    trie = SuffixTrie(6)
    trie.extend([1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4, 9, 2, 3])
    node, length = trie.longest_match([7, 9, 2, 3])
    # [9, 2, 3] occurs only at the end (nothing follows); [2, 3] is followed by 4, 5, 4.
    assert length == 2 and node == trie.children[trie.children[ROOT][2]][3]
    assert trie.draft(node, 5, 0.0)[0] == [4, 1, 2, 3]  # 4 (2 of 4 places), then one way on; depth 6 ends it
    assert trie.draft(node, 5, 0.6)[0] == []  # 4's share is 2/4 of the places [2, 3] occurs
    assert trie.draft(node, 1, 0.0) == ([4], 0.5)
    assert trie.longest_match([8]) == (ROOT, 0)


@pytest.mark.parametrize("depth", [2, 3, 6])
def test_the_open_match_is_the_longest_match_of_the_sequence_itself(depth):
    """``longest_open_match`` (the open nodes) finds what ``longest_match`` walks to, token by token."""
    rng = random.Random(20 + depth)
    trie, tokens = SuffixTrie(depth), []
    for _ in range(300):
        token = rng.randrange(4)
        trie.extend([token])
        tokens.append(token)
        node, length = trie.longest_open_match()
        assert (node, length) == trie.longest_match(tokens), tokens[-depth:]
