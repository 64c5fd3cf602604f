"""Mutation check of the LoRA resolver contract: broken copies of core's ``filesystem`` resolver
(``mutants/lora_resolver.py``) fail it with a message naming the bug, and the real resolver passes the
same run.

As in test_contract_mutants.py, the contract runs in a pytest subprocess with ``load_component``
pointed at the class under test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvserve.testing.mutation import Subject, contract_outcomes, failed

MUTANTS = Path(__file__).parent / "mutants"
CHECKS = [
    "test_resolve_lora_is_a_coroutine_function",
    "test_known_names_resolve_to_their_own_adapter",
    "test_unknown_names_give_none",
    "test_names_reaching_outside_the_store_give_none",
]
SUBJECTS = {
    "TestNamedByPath": Subject("lora_resolver", "mutant_lora_resolver:NamedByPath"),
    "TestReadsBeforeLooking": Subject("lora_resolver", "mutant_lora_resolver:ReadsBeforeLooking"),
    "TestFollowsPaths": Subject("lora_resolver", "mutant_lora_resolver:FollowsPaths"),
    "TestAnyFolder": Subject("lora_resolver", "mutant_lora_resolver:AnyFolder"),
    "TestFirstAdapterAlways": Subject("lora_resolver", "mutant_lora_resolver:FirstAdapterAlways"),
    "TestBlocking": Subject("lora_resolver", "mutant_lora_resolver:Blocking"),
    "TestRealFilesystem": Subject("lora_resolver", "kvserve.lora.filesystem_resolver:FilesystemResolver"),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict[str, str | None]]:
    """Test class -> test id -> failure message (None when it passed or was skipped)."""
    modules = {"mutant_lora_resolver": MUTANTS / "lora_resolver.py"}
    return contract_outcomes(SUBJECTS, tmp_path_factory.mktemp("lora-resolver-mutants"), modules)


def test_the_real_resolver_passes(outcomes):
    real = outcomes["TestRealFilesystem"]
    assert {test.split("[")[0] for test in real} >= set(CHECKS) and not failed(real), failed(real)


@pytest.mark.parametrize(
    ("test_class", "checks", "words"),
    [
        ("TestNamedByPath", {"test_known_names_resolve_to_their_own_adapter"}, "answered the name"),
        ("TestReadsBeforeLooking", set(CHECKS[2:]), "raised FileNotFoundError"),
        ("TestFollowsPaths", {"test_names_reaching_outside_the_store_give_none"}, "a path reaching outside the store"),
        ("TestAnyFolder", {"test_unknown_names_give_none"}, "'not-an-adapter' (not an adapter of the store)"),
        ("TestFirstAdapterAlways", {"test_known_names_resolve_to_their_own_adapter"}, "another adapter's directory"),
        ("TestBlocking", set(CHECKS), "resolve_lora is not an async def"),
    ],
)
def test_each_mutant_fails_its_check_only(outcomes, test_class, checks, words):
    failures = failed(outcomes[test_class])
    assert failures and {test.split("[")[0] for test in failures} <= checks, failures
    assert all(words in message for message in failures.values()), failures
