"""Mutation check of the reasoning parser contract: broken copies of core's ``deepseek_r1`` parser
(``mutants/reasoning_parser.py``) fail it with a message naming the bug, and the real parsers pass
the same run.

As in test_contract_mutants.py, the contract runs in a pytest subprocess with ``load_component``
pointed at the class under test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvserve.testing.mutation import Subject, contract_outcomes, failed

MUTANTS = Path(__file__).parent / "mutants"
SUBJECTS = {
    "TestEndTagWithinDelta": Subject("reasoning_parser", "mutant_reasoning_parser:EndTagWithinDelta"),
    "TestDropsHeldText": Subject("reasoning_parser", "mutant_reasoning_parser:DropsHeldText"),
    "TestSharedStream": Subject("reasoning_parser", "mutant_reasoning_parser:SharedStream"),
    "TestRealDeepSeekR1": Subject("reasoning_parser", "kvserve.reasoning:DeepSeekR1ReasoningParser"),
    "TestRealQwen3": Subject("reasoning_parser", "kvserve.reasoning:Qwen3ReasoningParser"),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict[str, str | None]]:
    """Test class -> test id -> failure message (None when it passed or was skipped)."""
    modules = {"mutant_reasoning_parser": MUTANTS / "reasoning_parser.py"}
    return contract_outcomes(SUBJECTS, tmp_path_factory.mktemp("reasoning-mutants"), modules)


@pytest.mark.parametrize("test_class", ["TestRealDeepSeekR1", "TestRealQwen3"])
def test_the_real_parsers_pass(outcomes, test_class):
    assert len(outcomes[test_class]) >= 8 and not failed(outcomes[test_class]), failed(outcomes[test_class])


@pytest.mark.parametrize(
    ("test_class", "check", "words"),
    [
        ("TestEndTagWithinDelta", "test_streaming_equals_the_whole_split", "reasoning '2 + 2 is 4.</think>The answer"),
        ("TestDropsHeldText", "test_streaming_equals_the_whole_split", "reasoning 'Cut short inside the end tag ' and"),
        ("TestSharedStream", "test_streams_keep_their_own_state", "parsers share state"),
    ],
)
def test_each_mutant_fails_its_check_only(outcomes, test_class, check, words):
    failures = failed(outcomes[test_class])
    assert failures and all(test.split("[")[0] == check for test in failures), failures
    assert all(words in message for message in failures.values()), failures
