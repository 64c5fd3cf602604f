"""Mutation check of the reasoning parser contract: broken copies of core's ``deepseek_r1`` parser
(``mutants/reasoning_parser.py``) fail it with a message naming the bug, and the real parsers pass
the same run.

As in test_contract_mutants.py, the contract runs in a pytest subprocess with ``load_component``
pointed at the class under test.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from kvserve.testing.check import run_pytest

MUTANTS = Path(__file__).parent / "mutants"
SUBJECTS = {
    "TestEndTagWithinDelta": ("mutant_reasoning_parser", "EndTagWithinDelta"),
    "TestDropsHeldText": ("mutant_reasoning_parser", "DropsHeldText"),
    "TestSharedStream": ("mutant_reasoning_parser", "SharedStream"),
    "TestRealDeepSeekR1": ("kvserve.reasoning", "DeepSeekR1ReasoningParser"),
    "TestRealQwen3": ("kvserve.reasoning", "Qwen3ReasoningParser"),
}


def _test_module() -> str:
    lines = ["from kvserve.testing import ReasoningParserContract"]
    for test_class, (module, subject) in SUBJECTS.items():
        lines.append(
            textwrap.dedent(f"""
            from {module} import {subject}

            class {test_class}(ReasoningParserContract):
                reasoning_parser = {subject}.name

                @classmethod
                def load_component(cls):
                    return {subject}
            """)
        )
    return "\n".join(lines)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict[str, str | None]]:
    """Test class -> test id -> failure message (None when it passed or was skipped)."""
    root = tmp_path_factory.mktemp("reasoning-mutants")
    (root / "mutant_reasoning_parser.py").write_text((MUTANTS / "reasoning_parser.py").read_text())
    (root / "test_mutants.py").write_text(_test_module())
    (root / "pytest.ini").write_text("[pytest]\n")
    python_path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    run = run_pytest(["test_mutants.py", "-q"], cwd=root, env={**os.environ, "PYTHONPATH": python_path}, capture=True)
    outcomes = {test_class: run.of_class(test_class) for test_class in SUBJECTS}
    assert all(outcomes.values()), run.output
    return outcomes


def failed(outcomes, test_class: str) -> dict[str, str]:
    return {test: message for test, message in outcomes[test_class].items() if message}


@pytest.mark.parametrize("test_class", ["TestRealDeepSeekR1", "TestRealQwen3"])
def test_the_real_parsers_pass(outcomes, test_class):
    assert len(outcomes[test_class]) >= 8 and not failed(outcomes, test_class), failed(outcomes, test_class)


@pytest.mark.parametrize(
    ("test_class", "check", "words"),
    [
        ("TestEndTagWithinDelta", "test_streaming_equals_the_whole_split", "reasoning '2 + 2 is 4.</think>The answer"),
        ("TestDropsHeldText", "test_streaming_equals_the_whole_split", "reasoning 'Cut short inside the end tag ' and"),
        ("TestSharedStream", "test_streams_keep_their_own_state", "parsers share state"),
    ],
)
def test_each_mutant_fails_its_check_only(outcomes, test_class, check, words):
    failures = failed(outcomes, test_class)
    assert failures and all(test.split("[")[0] == check for test in failures), failures
    assert all(words in message for message in failures.values()), failures
