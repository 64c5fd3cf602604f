"""Mutation check of the platform contract: broken copies of the CPU platform (``mutants/platform.py``)
fail it with a message naming the bug, and the real CPU platform passes the same run.

As in test_contract_mutants.py, the contract runs in a pytest subprocess with ``load_component``
pointed at the class under test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvserve.testing.mutation import Subject, contract_outcomes, failed

MUTANTS = Path(__file__).parent / "mutants"
SUBJECTS = {
    "TestUnsupportedDefault": Subject("platform", "mutant_platform:UnsupportedDefault"),
    "TestForgetsFreedMemory": Subject("platform", "mutant_platform:ForgetsFreedMemory"),
    "TestBudgetGrowsWithActivations": Subject("platform", "mutant_platform:BudgetGrowsWithActivations"),
    "TestHalfVersionedCapability": Subject("platform", "mutant_platform:HalfVersionedCapability"),
    "TestSamplerIgnoresMinP": Subject("platform", "mutant_platform:SamplerIgnoresMinP"),
    "TestSamplerKeepsEveryToken": Subject("platform", "mutant_platform:SamplerKeepsEveryToken"),
    "TestLoRAPrefillLosesLastToken": Subject("platform", "mutant_platform:LoRAPrefillLosesLastToken"),
    "TestLoRADecodeRowsShareOneAdapter": Subject("platform", "mutant_platform:LoRADecodeRowsShareOneAdapter"),
    "TestGatedProductSwapsGateAndUp": Subject("platform", "mutant_platform:GatedProductSwapsGateAndUp"),
    "TestLogitsSkipTheRounding": Subject("platform", "mutant_platform:LogitsSkipTheRounding"),
    "TestRealCpuPlatform": Subject("platform", "kvserve_platform_cpu.platform:CpuPlatform"),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict[str, str | None]]:
    """Test class -> test id -> failure message (None when it passed or was skipped)."""
    modules = {"mutant_platform": MUTANTS / "platform.py"}
    return contract_outcomes(SUBJECTS, tmp_path_factory.mktemp("platform-mutants"), modules)


def test_the_real_cpu_platform_passes(outcomes):
    assert len(outcomes["TestRealCpuPlatform"]) >= 8 and not failed(outcomes["TestRealCpuPlatform"])


@pytest.mark.parametrize(
    ("test_class", "check", "words"),
    [
        ("TestUnsupportedDefault", "test_default_dtype_is_supported_and_explained", "'float64' is not among"),
        ("TestForgetsFreedMemory", "test_profile_peak_memory_sees_memory_freed_inside", "held 67108864 bytes"),
        ("TestBudgetGrowsWithActivations", "test_kv_cache_memory_budget_is_positive", "more than with none"),
        ("TestHalfVersionedCapability", "test_capability_is_well_formed", "must both be ints >= 0 or both None"),
    ],
)
def test_each_mutant_fails_its_check_only(outcomes, test_class, check, words):
    failures = failed(outcomes[test_class])
    assert list(failures) == [check], failures
    assert words in failures[check], failures[check]


@pytest.mark.parametrize(
    ("test_class", "words"),
    [
        ("TestSamplerIgnoresMinP", "has no probability after min_p"),
        ("TestSamplerKeepsEveryToken", "inside=True"),
    ],
)
def test_each_sampling_kernel_mutant_fails_the_kernel_checks_only(outcomes, test_class, words):
    failures = failed(outcomes[test_class])
    assert failures and all(test.startswith("test_sampling_kernel_") for test in failures), failures
    assert any(words in message for message in failures.values()), failures


@pytest.mark.parametrize(
    ("test_class", "words"),
    [
        ("TestLoRAPrefillLosesLastToken", "is off the dense reference"),
        ("TestLoRADecodeRowsShareOneAdapter", "in a segment of 1 tokens) is off the dense reference"),
    ],
)
def test_each_lora_kernel_mutant_fails_the_lora_checks_only(outcomes, test_class, words):
    failures = failed(outcomes[test_class])
    assert failures and all(test.startswith("test_lora_kernel_") for test in failures), failures
    assert all(words in message for message in failures.values()), failures


def test_a_gated_product_mutant_fails_the_gated_check_only(outcomes):
    failures = failed(outcomes["TestGatedProductSwapsGateAndUp"])
    assert failures and all(test.startswith("test_linear_kernel_gated_product") for test in failures), failures
    assert all("is not silu(gate) * up" in message for message in failures.values()), failures


def test_a_logits_mutant_fails_the_logits_check_only(outcomes):
    failures = failed(outcomes["TestLogitsSkipTheRounding"])
    assert failures and all(test.startswith("test_linear_kernel_logits") for test in failures), failures
    assert all("is not apply's product widened to float32" in message for message in failures.values()), failures
