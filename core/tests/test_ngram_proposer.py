"""The built-in ``ngram`` proposer against the DraftProposer contract, and its prompt lookup itself."""

from kvserve.config import SpeculativeConfig
from kvserve.interfaces.proposer import DraftRequest
from kvserve.spec_decode.ngram import NgramProposer
from kvserve.testing import DraftProposerContract


class TestNgram(DraftProposerContract):
    proposer = "ngram"


def ngram(low: int, high: int) -> NgramProposer:
    return NgramProposer(
        SpeculativeConfig(method="ngram", num_speculative_tokens=4, prompt_lookup_min=low, prompt_lookup_max=high), 100
    )


def test_the_longest_suffix_match_wins_and_its_most_recent_occurrence():
    # Suffix [1, 2, 3]: "1 2 3" occurs at 0 (then 7) and at 5 (then 9); the 1-gram "3" also at 8.
    tokens = [1, 2, 3, 7, 0, 1, 2, 3, 9, 3, 5, 1, 2, 3]
    assert ngram(1, 3).propose([DraftRequest("r", tokens[:4], tokens[4:])], [2]) == [[9, 3]]
    # With n <= 1 only the last "3" is looked up: its most recent earlier occurrence is at 9 (then 5).
    assert ngram(1, 1).propose([DraftRequest("r", tokens, [])], [3]) == [[5, 1, 2]]


def test_nothing_shorter_than_prompt_lookup_min_is_matched():
    tokens = [4, 5, 6, 1, 2, 9, 6]  # only the 1-gram "6" recurs
    assert ngram(2, 4).propose([DraftRequest("r", tokens, [])], [4]) == [[]]
    assert ngram(1, 4).propose([DraftRequest("r", tokens, [])], [4]) == [[1, 2, 9, 6]]


def test_drafts_follow_the_request_as_it_grows():
    proposer = ngram(2, 2)
    prompt, output = [8, 1, 2, 3, 4], [1]
    assert proposer.propose([DraftRequest("r", prompt, output)], [3]) == [[]]  # the suffix "4 1" never occurred before
    output.append(2)
    assert proposer.propose([DraftRequest("r", prompt, output)], [3]) == [[3, 4, 1]]
