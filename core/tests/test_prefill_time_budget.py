"""PrefillTimeBudget: the prefill tokens a step that decodes may carry, learnt from step times."""

from __future__ import annotations

from kvserve.interfaces.scheduler import ScheduledRequest, SchedulerOutput
from kvserve.request import Request
from kvserve.sampling_params import SamplingParams
from kvserve.scheduling.prefill_time_budget import PrefillTimeBudget, split_tokens


def plan(decodes: int, prefill: int) -> SchedulerOutput:
    """``decodes`` requests one token past their 4-token prompts, and one prompt's ``prefill``-token chunk."""
    scheduled = [ScheduledRequest(Request(f"d{i}", [1] * 4, SamplingParams()), 4, 1) for i in range(decodes)]
    if prefill:
        scheduled.append(ScheduledRequest(Request("p", [1] * 1000, SamplingParams()), 10, prefill))
    return SchedulerOutput(scheduled)


def test_a_plan_splits_into_decodes_and_prefill_tokens_a_recompute_prefilling():
    recomputed = Request("r", [1] * 4, SamplingParams(), output_token_ids=[5, 6])
    output = plan(3, 7)
    output.scheduled.append(ScheduledRequest(recomputed, 0, 6))  # preempted: prompt and output again
    assert split_tokens(output) == (3, 13)


def test_no_limit_until_a_decode_only_step_is_timed_nor_when_nothing_decodes():
    budget = PrefillTimeBudget(2.0)
    assert budget.prefill_tokens(8) is None
    budget.record(plan(0, 500), 3.0)  # only prefill: says nothing about decoding
    assert budget.prefill_tokens(8) is None
    budget.record(plan(8, 0), 0.02)
    assert budget.prefill_tokens(0) is None
    assert budget.prefill_tokens(8) == 8  # first guess: a prefill token costs a decode token's share


def test_the_limit_converges_to_what_keeps_a_step_within_the_slowdown():
    """Steps cost 20 ms plus 0.5 ms per prefill token: at 1.5x, 10 ms of prefill is 20 tokens."""
    budget = PrefillTimeBudget(1.5)
    budget.record(plan(16, 0), 0.020)
    for _ in range(40):
        tokens = budget.prefill_tokens(16)
        budget.record(plan(16, tokens), 0.020 + 0.0005 * tokens)
    assert budget.prefill_tokens(16) == 20


def test_a_mixed_step_faster_than_the_decode_estimate_lowers_it_and_the_limit_at_most_doubles():
    """When the batch that decodes shrinks, the decode-only estimate is stale: a mixed step taking
    less than it lowers it (so prefill does not look free), and the limit grows at most 2x a step."""
    budget = PrefillTimeBudget(2.0)
    budget.record(plan(28, 0), 0.030)
    budget.record(plan(28, 28), 0.045)  # 0.5 ms a prefill token beyond the 30 ms
    assert budget.prefill_token_seconds == 0.015 / 28
    budget.record(plan(2, 28), 0.020)  # two decodes now: faster than the 30 ms estimate
    assert budget.decode_step_seconds == 0.5 * 0.020  # 20 ms less 15 of prefill, but at least half the step
    assert 0 < budget.prefill_tokens(2) <= 2 * 28
    for _ in range(6):
        limit = budget.prefill_tokens(2)
        budget.record(plan(2, limit), 0.001)  # implausibly fast steps: the limit still only doubles
        assert budget.prefill_tokens(2) <= 2 * limit


def test_a_limit_below_one_token_still_lets_a_prompt_progress():
    budget = PrefillTimeBudget(1.01)
    budget.record(plan(2, 0), 0.010)
    budget.record(plan(2, 4), 0.050)
    assert budget.prefill_tokens(2) == 1
