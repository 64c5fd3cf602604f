"""The suffix proposer: its trie follows the request as tokens are accepted, forgets it on finish,
caches finished outputs up to ``suffix_decoding_max_cached_requests``, drafts adaptively; its
fields are validated at start."""

from __future__ import annotations

import random

import pytest

from kvserve.config import SpeculativeConfig
from kvserve.errors import ConfigError
from kvserve.interfaces.proposer import DraftRequest
from kvserve_proposer_suffix.proposer import SuffixProposer
from kvserve_proposer_suffix.trie import SuffixTrie


def proposer(**fields) -> SuffixProposer:
    return SuffixProposer(SpeculativeConfig(method="suffix", num_speculative_tokens=8, **fields), 100)


def test_the_trie_grows_with_accepted_tokens_as_if_built_at_once():
    rng = random.Random(0)
    prompt = [rng.randrange(5) for _ in range(30)]
    output = [rng.randrange(5) for _ in range(40)]
    grown = proposer(suffix_decoding_min_token_prob=0.0)
    at = 0
    while at < len(output):
        at += rng.randint(1, 5)  # a step accepts a few tokens
        drafts = grown.propose([DraftRequest("r", prompt, output[:at])], [8])
        fresh = proposer(suffix_decoding_min_token_prob=0.0).propose([DraftRequest("r", prompt, output[:at])], [8])
        assert drafts == fresh
    whole = SuffixTrie(24)
    whole.extend(prompt + output)
    assert grown.requests["r"].trie.num_nodes == whole.num_nodes


def test_drafts_are_adaptive_in_length():
    text = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    p = proposer(suffix_decoding_max_spec_factor=1.0)
    # A match of 3 tokens ([10, 11, 12]) drafts at most 3.
    assert p.propose([DraftRequest("a", text + [10, 11, 12], [])], [8]) == [[13, 14, 15]]
    # A match of 1 token drafts 1; with factor 2, 2.
    assert p.propose([DraftRequest("b", text + [50, 16], [])], [8]) == [[17]]
    assert proposer(suffix_decoding_max_spec_factor=2.0).propose([DraftRequest("c", text + [50, 16], [])], [8]) == [
        [17, 18]
    ]
    # An ambiguous continuation (13 once, 40 twice after [11, 12]) stops where its share gets too low.
    branching = text + [11, 12, 40, 11, 12, 40, 1, 11, 12]
    # [11, 12] then 40 (2 of 4 places: 0.5), then 1 (1 of 2 after 40: 0.25); 2 tokens matched, 2 drafted.
    assert proposer().propose([DraftRequest("d", branching, [])], [8]) == [[40, 1]]
    assert proposer(suffix_decoding_min_token_prob=0.3).propose([DraftRequest("d", branching, [])], [8]) == [[40]]
    assert proposer(suffix_decoding_min_token_prob=0.7).propose([DraftRequest("d", branching, [])], [8]) == [[]]


def test_finished_outputs_are_cached_and_evicted_oldest_first():
    p = proposer(suffix_decoding_max_cached_requests=2)
    outputs = {f"r{i}": [20 + i, 30 + i, 40 + i, 50 + i, 60 + i] for i in range(3)}
    for request_id, output in outputs.items():
        p.propose([DraftRequest(request_id, [1, 2], output)], [4])
        p.forget(request_id)
        assert request_id not in p.requests
    assert list(p.cached) == ["r1", "r2"]
    # A new request that starts as r1's output did drafts the rest of it; r0's is gone.
    assert p.propose([DraftRequest("n1", [7, 21, 31], [])], [4]) == [[41, 51]]
    assert p.propose([DraftRequest("n0", [7, 20, 30], [])], [4]) == [[]]
    expected = SuffixTrie(24)
    for request_id in ("r1", "r2"):
        expected.extend(outputs[request_id])
        expected.end_sequence()
    assert p.global_trie.num_nodes == expected.num_nodes


def test_without_a_cache_nothing_outlives_its_request():
    p = proposer(suffix_decoding_max_cached_requests=0)
    p.propose([DraftRequest("r", [1, 2, 3, 1, 2], [3, 1])], [4])
    p.forget("r")
    assert not p.requests and p.global_trie.num_nodes == 0


def test_memory_is_bounded_by_depth_tokens_and_cached_requests():
    rng = random.Random(1)
    p = proposer(suffix_decoding_max_tree_depth=4, suffix_decoding_max_cached_requests=3)
    for i in range(20):
        output = [rng.randrange(50) for _ in range(30)]
        p.propose([DraftRequest(f"r{i}", [1], output)], [4])
        assert p.requests[f"r{i}"].trie.num_nodes <= 4 * 31
        p.forget(f"r{i}")
        assert len(p.cached) <= 3 and p.global_trie.num_nodes <= 4 * 30 * 3


def test_its_fields_are_checked_at_start_naming_them():
    with pytest.raises(ConfigError, match=r"speculative_config\.suffix_decoding_max_tree_dept: Extra inputs"):
        proposer(suffix_decoding_max_tree_dept=8)
    with pytest.raises(ConfigError, match=r"speculative_config\.prompt_lookup_maxx: Extra inputs.*method 'suffix'"):
        proposer(prompt_lookup_maxx=3)
    with pytest.raises(ConfigError, match=r"speculative_config\.suffix_decoding_min_token_prob: Input should be"):
        proposer(suffix_decoding_min_token_prob=1.5)
    assert proposer().method_options.suffix_decoding_max_tree_depth == 24
