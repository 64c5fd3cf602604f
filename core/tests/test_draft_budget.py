"""The draft budget keeps the drafts that raise a step's expected tokens per second, and only those."""

from __future__ import annotations

import pytest

from kvserve.spec_decode.draft_budget import PRIOR_ACCEPTANCE, DraftBudget, size_class


def budget_with(costs: dict[int, float], acceptance: dict[str, tuple[int, int]] | None = None) -> DraftBudget:
    """A budget that has seen one step of each ``tokens: seconds`` and, per request, ``(drafts,
    accepted)`` verifications repeated until its average settles."""
    budget = DraftBudget()
    for tokens, seconds in costs.items():
        budget.record_step(tokens, seconds)
    for request_id, (drafts, kept) in (acceptance or {}).items():
        for _ in range(30):
            budget.record_verification(request_id, drafts, kept)
    return budget


def test_size_classes_are_powers_of_two():
    assert [size_class(n) for n in (0, 1, 2, 3, 4, 7, 8, 33, 64)] == [1, 1, 2, 2, 3, 3, 4, 6, 7]


def test_before_any_step_every_draft_is_kept():
    assert DraftBudget().lengths(["a", "b"], [4, 0], num_rows=2) == [4, 0]


def test_a_single_stream_whose_steps_cost_the_same_verifies_every_draft():
    budget = budget_with({1: 0.020, 2: 0.020, 5: 0.020}, {"a": (4, 1)})
    assert budget.lengths(["a"], [4], num_rows=1) == [4]


def test_when_every_token_costs_its_share_no_draft_pays():
    # Step seconds proportional to tokens: a draft accepted with probability < 1 always lowers tokens/s.
    budget = budget_with({n: 0.001 * n for n in (32, 64, 128, 256)}, {f"r{i}": (4, 3) for i in range(32)})
    assert budget.lengths([f"r{i}" for i in range(32)], [4] * 32, num_rows=32) == [0] * 32


def test_the_likeliest_drafts_are_kept_first():
    # 32 rows cost 10 ms, 64 rows 14 ms, 128 rows 30 ms: up to 64 a token costs 0.125 ms, so a draft
    # pays at an expected ~0.4 tokens and more; past 64 it costs 0.25 ms and needs ~0.9.
    budget = budget_with({32: 0.010, 64: 0.014, 128: 0.030}, {"copy": (4, 4), "chat": (4, 0)})
    ids = ["copy", "chat", *(f"new{i}" for i in range(30))]
    lengths = budget.lengths(ids, [4] * 32, num_rows=32)
    assert lengths[0] == 4, "a request whose drafts are always accepted keeps them all"
    assert lengths[1] == 0, "a request whose drafts are never accepted keeps none"
    # New requests (acceptance 0.5 assumed): a first draft each, until the step passes 64 tokens.
    assert set(lengths[2:]) == {0, 1} and 32 + sum(lengths) == 64


def test_a_size_never_seen_is_tried_then_judged_by_what_it_cost():
    budget = budget_with({1: 0.020})
    assert budget.lengths(["a"], [4], num_rows=1) == [4], "an unseen size costs as the nearest seen"
    for _ in range(40):
        budget.record_step(5, 0.100)  # five tokens cost five times one
    assert budget.lengths(["a"], [4], num_rows=1) == [0]


def test_acceptance_follows_recent_verifications_and_is_forgotten_with_the_request():
    budget = DraftBudget()
    budget.record_verification("a", 4, 4)
    assert budget.acceptance["a"] > PRIOR_ACCEPTANCE
    budget.forget("a")
    assert "a" not in budget.acceptance


@pytest.mark.parametrize("proposed", [[0, 0], [1, 0], [3, 5]])
def test_never_more_than_proposed(proposed):
    budget = budget_with({1: 0.01, 2: 0.01, 4: 0.01, 8: 0.01})
    lengths = budget.lengths(["a", "b"], proposed, num_rows=2)
    assert all(0 <= n <= p for n, p in zip(lengths, proposed))
