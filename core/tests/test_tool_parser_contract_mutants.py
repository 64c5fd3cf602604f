"""Mutation check of the tool parser contract: broken copies of the ``hermes`` parser
(``mutants/tool_parser.py``) fail it with a message naming the bug, and the real parser passes the same run.

As in test_contract_mutants.py, the contract runs in a pytest subprocess with ``load_component``
pointed at the class under test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvserve.testing.contracts.tool_parser import HermesContract
from kvserve.testing.mutation import Subject, contract_outcomes, failed

MUTANTS = Path(__file__).parent / "mutants"
HERMES = "kvserve.testing.contracts.tool_parser:HermesContract"
SUBJECTS = {
    "TestLosesSplitDelimiter": Subject("tool_parser", "mutant_tool_parser:LosesSplitDelimiter", HERMES),
    "TestForgetsHeldText": Subject("tool_parser", "mutant_tool_parser:ForgetsHeldText", HERMES),
    "TestRealHermes": Subject("tool_parser", "kvserve.tool_calling.hermes:HermesToolParser", HERMES),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict[str, str | None]]:
    """Test class -> test id -> failure message (None when it passed or was skipped)."""
    modules = {"mutant_tool_parser": MUTANTS / "tool_parser.py"}
    return contract_outcomes(SUBJECTS, tmp_path_factory.mktemp("tool-parser-mutants"), modules)


def test_the_real_hermes_parser_passes(outcomes):
    assert len(outcomes["TestRealHermes"]) >= 30 and not failed(outcomes["TestRealHermes"])


def test_a_parser_losing_a_delimiter_cut_by_a_delta_is_caught(outcomes):
    failures = failed(outcomes["TestLosesSplitDelimiter"])
    streamed = {t: m for t, m in failures.items() if t.startswith("test_stream_cut_anywhere_gives_the_whole_reply")}
    with_calls = [case for case in HermesContract().cases() if case.tool_calls]
    assert len(streamed) == len(with_calls), list(failures)
    for message in streamed.values():
        assert "cut after byte" in message and "but the whole reply gives" in message, message
    assert not any(t.startswith("test_whole_reply_holds") for t in failures), "a whole reply is parsed right"


def test_a_parser_forgetting_held_back_text_is_caught(outcomes):
    failures = failed(outcomes["TestForgetsHeldText"])
    plain = {t: m for t, m in failures.items() if t.startswith("test_text_without_calls_is_content_unchanged")}
    assert "test_text_without_calls_is_content_unchanged[Trailing whitespace stays  \\n]" in plain, list(failures)
    assert all("parsed as content" in m for m in plain.values()), plain
