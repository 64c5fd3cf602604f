"""Mutation check of the DraftProposer contract: broken copies of core's ``ngram`` proposer
(``mutants/proposer.py``) fail it with a message naming the bug, and the real one passes the same run.

As in test_contract_mutants.py, the contract runs in a pytest subprocess with ``load_component``
pointed at the class under test. The engine check is left out here (``-k``): the verification behind
it sanitizes malformed drafts, and core/tests/test_ngram_proposer.py runs it for the real proposer.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvserve.testing.mutation import Subject, contract_outcomes, failed

MUTANTS = Path(__file__).parent / "mutants"
SUBJECTS = {
    "TestOneTooMany": Subject("proposer", "mutant_proposer:OneTooMany"),
    "TestPastTheVocabulary": Subject("proposer", "mutant_proposer:PastTheVocabulary"),
    "TestBatchDependent": Subject("proposer", "mutant_proposer:BatchDependent"),
    "TestRealNgram": Subject("proposer", "kvserve.spec_decode.ngram:NgramProposer"),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict[str, str | None]]:
    """Test class -> test id -> failure message (None when it passed or was skipped)."""
    modules = {"mutant_proposer": MUTANTS / "proposer.py"}
    root = tmp_path_factory.mktemp("proposer-mutants")
    return contract_outcomes(SUBJECTS, root, modules, ["-k", "not exactly_those_without_speculation"])


def test_the_real_ngram_passes(outcomes):
    assert len(outcomes["TestRealNgram"]) >= 8 and not failed(outcomes["TestRealNgram"]), failed(
        outcomes["TestRealNgram"]
    )


@pytest.mark.parametrize(
    ("test_class", "check", "words"),
    [
        ("TestOneTooMany", "test_proposals_are_well_formed_and_never_longer_than_asked", "asked for at most"),
        ("TestPastTheVocabulary", "test_proposals_are_well_formed_and_never_longer_than_asked", "are not ints in"),
        ("TestBatchDependent", "test_proposals_are_deterministic_and_independent_of_the_batch", "alone in the batch"),
    ],
)
def test_each_mutant_fails_its_check_only(outcomes, test_class, check, words):
    failures = failed(outcomes[test_class])
    assert failures and all(test.split("[")[0] == check for test in failures), failures
    assert all(words in message for message in failures.values()), failures
