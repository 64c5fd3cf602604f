"""Mutation check of the structured-output backend contract: broken copies of the xgrammar backend
(``mutants/structured_output.py``) fail it with a message naming the bug, and the real xgrammar
backend passes the same run.

As in test_contract_mutants.py, the contract runs in a pytest subprocess with ``load_component``
pointed at the class under test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvserve.testing.mutation import Subject, contract_outcomes, failed

MUTANTS = Path(__file__).parent / "mutants"
KIND = "structured_output_backend"
SUBJECTS = {
    "TestSkipsTheMask": Subject(KIND, "mutant_structured_output:SkipsTheMask"),
    "TestIgnoresEos": Subject(KIND, "mutant_structured_output:IgnoresEos"),
    "TestRealXgrammar": Subject(KIND, "kvserve_structured_outputs_xgrammar.backend:XgrammarBackend"),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict[str, str | None]]:
    """Test class -> test id -> failure message (None when it passed or was skipped)."""
    modules = {"mutant_structured_output": MUTANTS / "structured_output.py"}
    return contract_outcomes(SUBJECTS, tmp_path_factory.mktemp("structured-output-mutants"), modules)


def test_the_real_xgrammar_backend_passes(outcomes):
    assert len(outcomes["TestRealXgrammar"]) >= 30 and not failed(outcomes["TestRealXgrammar"])


def test_a_backend_that_skips_the_mask_is_caught(outcomes):
    failures = failed(outcomes["TestSkipsTheMask"])
    forbidden = {t: m for t, m in failures.items() if t.startswith("test_a_token_the_grammar_forbids")}
    assert len(forbidden) == 2 and all("where the schema forbids it" in m for m in forbidden.values()), failures
    assert "past the tokenizer's 49152 tokens" in failures.get("test_padding_ids_are_never_allowed", ""), failures
    document = failures.get("test_a_json_document_is_allowed_token_by_token_and_eos_only_at_its_end", "")
    assert "is allowed after '', before the document is complete" in document, failures
    assert not any(t.startswith("test_malformed_constraints") for t in failures), "validate is not the mask's business"


def test_a_backend_that_ignores_eos_is_caught(outcomes):
    failures = failed(outcomes["TestIgnoresEos"])
    document = failures.get("test_a_json_document_is_allowed_token_by_token_and_eos_only_at_its_end", "")
    assert "is not allowed after the complete document" in document, failures
    walks = {t: m for t, m in failures.items() if t.startswith("test_a_random_walk")}
    assert len(walks) == 12, failures
    for message in walks.values():
        assert (
            "never reached an allowed EOS" in message or "(not even EOS), where the grammar goes on or may" in message
        )
    assert not any(t.startswith(("test_malformed", "test_a_token_the_grammar_forbids")) for t in failures), failures
