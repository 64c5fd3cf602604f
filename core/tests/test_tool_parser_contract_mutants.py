"""Mutation check of the tool parser contract: broken copies of the ``hermes`` parser
(``mutants/tool_parser.py``) fail it with a message naming the bug, and the real parser passes the same run.

As in test_contract_mutants.py, the contract runs in a pytest subprocess with ``load_component``
pointed at the class under test.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from kvserve.testing.check import run_pytest
from kvserve.testing.contracts.tool_parser import HermesContract

MUTANTS = Path(__file__).parent / "mutants"
SUBJECTS = {
    "TestLosesSplitDelimiter": ("mutant_tool_parser", "LosesSplitDelimiter"),
    "TestForgetsHeldText": ("mutant_tool_parser", "ForgetsHeldText"),
    "TestRealHermes": ("kvserve.tool_calling.hermes", "HermesToolParser"),
}


def _test_module() -> str:
    lines = ["from kvserve.testing.contracts.tool_parser import HermesContract"]
    for test_class, (module, subject) in SUBJECTS.items():
        lines.append(
            textwrap.dedent(f"""
            from {module} import {subject}

            class {test_class}(HermesContract):
                tool_parser = {subject}.name

                @classmethod
                def load_component(cls):
                    return {subject}
            """)
        )
    return "\n".join(lines)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict[str, str | None]]:
    """Test class -> test id -> failure message (None when it passed)."""
    root = tmp_path_factory.mktemp("tool-parser-mutants")
    (root / "mutant_tool_parser.py").write_text((MUTANTS / "tool_parser.py").read_text())
    (root / "test_mutants.py").write_text(_test_module())
    (root / "pytest.ini").write_text("[pytest]\n")
    python_path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    run = run_pytest(["test_mutants.py", "-q"], cwd=root, env={**os.environ, "PYTHONPATH": python_path}, capture=True)
    outcomes = {test_class: run.of_class(test_class) for test_class in SUBJECTS}
    assert all(outcomes.values()), run.output
    return outcomes


def failed(outcomes, test_class: str) -> dict[str, str]:
    return {test: message for test, message in outcomes[test_class].items() if message}


def test_the_real_hermes_parser_passes(outcomes):
    assert len(outcomes["TestRealHermes"]) >= 30 and not failed(outcomes, "TestRealHermes")


def test_a_parser_losing_a_delimiter_cut_by_a_delta_is_caught(outcomes):
    failures = failed(outcomes, "TestLosesSplitDelimiter")
    streamed = {t: m for t, m in failures.items() if t.startswith("test_stream_cut_anywhere_gives_the_whole_reply")}
    with_calls = [case for case in HermesContract().cases() if case.tool_calls]
    assert len(streamed) == len(with_calls), list(failures)
    for message in streamed.values():
        assert "cut after byte" in message and "but the whole reply gives" in message, message
    assert not any(t.startswith("test_whole_reply_holds") for t in failures), "a whole reply is parsed right"


def test_a_parser_forgetting_held_back_text_is_caught(outcomes):
    failures = failed(outcomes, "TestForgetsHeldText")
    plain = {t: m for t, m in failures.items() if t.startswith("test_text_without_calls_is_content_unchanged")}
    assert "test_text_without_calls_is_content_unchanged[Trailing whitespace stays  \\n]" in plain, list(failures)
    assert all("parsed as content" in m for m in plain.values()), plain
