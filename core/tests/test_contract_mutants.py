"""Mutation check of the contract suites: deliberately broken plugins (``mutants/``) must fail
their contract, with a message that names the broken behaviour.

Each mutant is a copy of a real plugin (the CPU attention backend, the FIFO scheduler, core's
paged KV cache manager) with one plausible bug. One pytest session runs the contracts against every mutant and against
the unbroken plugins, exactly as a plugin's ``tests/test_contract.py`` would, with
``load_component`` pointed at the class under test. The session runs in a subprocess: an
in-process one would unload the torch modules it imported first, and torch crashes when
they are imported again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvserve.testing.mutation import Subject, contract_outcomes
from kvserve.testing.mutation import failed as failures

MUTANTS = Path(__file__).parent / "mutants"
SUBJECTS = {
    "TestWrongSlotWrite": Subject("attention_backend", "mutant_attention:WrongSlotWrite"),
    "TestCausalOffByOne": Subject("attention_backend", "mutant_attention:CausalOffByOne"),
    "TestGqaTiledHeads": Subject("attention_backend", "mutant_attention:GqaTiledHeads"),
    "TestWindowOffByOne": Subject("attention_backend", "mutant_attention:WindowOffByOne"),
    "TestLookaheadSeesAhead": Subject("attention_backend", "mutant_attention:LookaheadSeesAhead"),
    "TestRealCpuBackend": Subject("attention_backend", "kvserve_attention_cpu.backend:CpuAttentionBackend"),
    "TestOverBudget": Subject("scheduler", "mutant_scheduler:OverBudget"),
    "TestLeaksOnAbort": Subject("scheduler", "mutant_scheduler:LeaksOnAbort"),
    "TestAppendsPastStop": Subject("scheduler", "mutant_scheduler:AppendsPastStop"),
    "TestAdmitsBeforeReady": Subject("scheduler", "mutant_scheduler:AdmitsBeforeReady"),
    "TestRealFifo": Subject("scheduler", "kvserve_scheduler_fifo.scheduler:FifoScheduler"),
    "TestTruncateKeepsBlocks": Subject("kv_cache_manager", "mutant_kv_cache:TruncateKeepsBlocks"),
    "TestOffersUncomputedToken": Subject("kv_cache_manager", "mutant_kv_cache:OffersUncomputedToken"),
    "TestRealPaged": Subject("kv_cache_manager", "kvserve.kv_cache.paged:PagedKVCacheManager"),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict[str, str | None]]:
    """Test class -> test id -> failure message (None when it passed or was skipped)."""
    modules = {f"mutant_{name}": MUTANTS / f"{name}.py" for name in ("attention", "scheduler", "kv_cache")}
    # The float32, head size 64 part of the attention suite is enough to name each bug.
    only = ["-k", "not bfloat16 and not float16 and not d128"]
    return contract_outcomes(SUBJECTS, tmp_path_factory.mktemp("mutants"), modules, only)


def test_the_unbroken_plugins_pass(outcomes):
    """The harness is sound: the real CPU backend, FIFO scheduler and paged manager pass the same runs."""
    for test_class in ("TestRealCpuBackend", "TestRealFifo", "TestRealPaged"):
        assert len(outcomes[test_class]) > 15, f"{test_class} ran only {len(outcomes[test_class])} checks"
        assert not failures(outcomes[test_class]), failures(outcomes[test_class])


def test_attention_mutant_writing_the_wrong_slot_is_caught(outcomes):
    failed = failures(outcomes["TestWrongSlotWrite"])
    message = failed.get("test_write_kv_stores_exactly_the_slot_mapping[float32]", "")
    assert "write_kv put token 0's key in slot(s) [" in message and "given by slot_mapping" in message, failed
    wrong_reads = failures(outcomes["TestWrongSlotWrite"], "test_matches_reference")
    assert wrong_reads and all("Values of never-written cache slots" in m for m in wrong_reads.values())


def test_attention_mutant_with_causal_mask_off_by_one_is_caught(outcomes):
    failed = failures(outcomes["TestCausalOffByOne"], "test_matches_reference")
    assert any("prefill-" in t for t in failed) and any("chunked-" in t for t in failed), failed
    assert not any("decode-" in t for t in failed), "decodes see no later token: they must not fail"
    for message in failed.values():
        assert "causal mask is off by one: each query also sees the next token" in message, message


def test_attention_mutant_mapping_gqa_heads_wrong_is_caught(outcomes):
    failed = failures(outcomes["TestGqaTiledHeads"], "test_matches_reference")
    assert failed and all("-gqa-" in t for t in failed), f"only GQA batches are affected: {list(failed)}"
    for message in failed.values():
        assert "GQA maps query head h to KV head h % num_kv_heads instead of h // " in message, message


def test_attention_mutant_without_causality_among_a_short_querys_rows_is_caught(outcomes):
    failed = failures(outcomes["TestLookaheadSeesAhead"])
    lookahead = {t: m for t, m in failed.items() if t.startswith("test_short_multi_token_queries_over_long_contexts")}
    assert set(lookahead) == {
        "test_short_multi_token_queries_over_long_contexts[plain-float32]",
        "test_short_multi_token_queries_over_long_contexts[window-softcap-float32]",
    }, list(failed)
    assert (
        "queries see later tokens of their sequence"
        in lookahead["test_short_multi_token_queries_over_long_contexts[plain-float32]"]
    )
    for message in lookahead.values():
        assert "chunked prefill of 2 after 319 cached" in message and "decode of" not in message, message


def test_attention_mutant_with_sliding_window_off_by_one_is_caught(outcomes):
    failed = failures(outcomes["TestWindowOffByOne"])
    assert set(failed) >= {
        "test_layer_facts_match_reference[window-mixed-gqa-d64-bs16-float32]",
        "test_layer_facts_match_reference[window-softcap-mixed-gqa-d64-bs3-float32]",
        "test_layers_of_different_kinds_share_one_metadata",
    }, list(failed)
    window_tests = (
        "test_layer_facts_match_reference[window",
        "test_layers_of_",
        "test_short_multi_token_queries_over_long_contexts[window",
    )
    assert all(t.startswith(window_tests) for t in failed), (
        f"only layers with a sliding window are affected: {list(failed)}"
    )
    for test, message in failed.items():
        if test.startswith(("test_layer_facts_match_reference[window-mixed", "test_short_multi_token_queries")):
            assert "sliding window is off by one: each query also sees the key sliding_window positions back" in (
                message
            ), message


def test_scheduler_mutant_exceeding_the_token_budget_is_caught(outcomes):
    failed = failures(outcomes["TestOverBudget"], "test_random_workload_keeps_every_invariant")
    assert failed, outcomes["TestOverBudget"]
    assert all("tokens, over max_num_batched_tokens=" in m for m in failed.values()), failed


def test_scheduler_mutant_leaking_blocks_is_caught(outcomes):
    failed = failures(outcomes["TestLeaksOnAbort"])
    message = failed.get("test_abort_frees_blocks_and_forgets_the_request", "")
    assert "after aborting a" in message and "blocks leaked" in message, failed


def test_scheduler_mutant_appending_past_a_stop_is_caught(outcomes):
    failed = failures(outcomes["TestAppendsPastStop"])
    assert failed and all(t.startswith("test_drafts_change_no_output") for t in failed), list(failed)
    assert all("up to the first stop" in m for m in failed.values()), failed


def test_scheduler_mutant_admitting_before_ready_is_caught(outcomes):
    failed = failures(outcomes["TestAdmitsBeforeReady"])
    message = failed.get("test_request_held_until_ready_does_not_block_others", "")
    assert "held was scheduled before it was ready" in message, failed


def test_kv_mutant_keeping_rejected_draft_slots_is_caught(outcomes):
    failed = failures(outcomes["TestTruncateKeepsBlocks"])
    message = failed.get("test_truncate_gives_back_the_slots_of_rejected_drafts", "")
    assert "truncating to 8 tokens turned table" in message, failed
    assert any(t.startswith("test_random_lookahead_keeps_exact_accounting") for t in failed), list(failed)


def test_kv_mutant_offering_an_uncomputed_token_is_caught(outcomes):
    failed = failures(outcomes["TestOffersUncomputedToken"])
    assert list(failed) == ["test_drafts_are_offered_only_once_accepted_and_computed"], list(failed)
    assert "a block whose last token has no KV must not be offered" in next(iter(failed.values())), failed
