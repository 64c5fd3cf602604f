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


def test_no_limit_until_a_decode_only_step_is_timed_nor_for_a_burst_one_step_takes():
    budget = PrefillTimeBudget(2.0)
    assert budget.prefill_tokens(8) is None
    budget.record(plan(8, 10), 0.05)  # mixed, but nothing to compare it with yet
    assert budget.prefill_tokens(8) is None and budget.prefill_token_seconds is None
    budget.record(plan(8, 0), 0.02)
    assert budget.prefill_tokens(0) is None
    assert budget.prefill_tokens(8) == 8  # first guess: a prefill token costs a decode token's share
    assert budget.prefill_tokens(8, [10] * 8, token_budget=100) == 8  # as many prompts as decodes
    assert budget.prefill_tokens(8, [10] * 9, token_budget=100) is None  # a burst one step takes whole
    assert budget.prefill_tokens(8, [10] * 9 + [11], token_budget=100) == 8  # more than one step holds


def test_a_step_that_only_prefills_gives_the_first_guess_of_a_prefill_tokens_cost():
    budget = PrefillTimeBudget(2.0)
    budget.record(plan(0, 500), 3.0)  # 6 ms a token, fixed costs included
    budget.record(plan(0, 10), 1.0)  # only the first such step counts
    budget.record(plan(8, 0), 0.024)
    assert budget.prefill_tokens(8) == 4  # 24 ms more at 6 ms a token
    budget.record(plan(8, 4), 0.028)
    assert budget.prefill_token_seconds == 0.001  # measured: replaces the guess, not averaged with it


def test_a_decode_only_step_is_estimated_on_a_line_through_the_batch_sizes_measured():
    """Weights read once a step plus a cost per row: 10 ms + 1 ms a decode. A batch size not yet
    measured is read off the line, so decodes finishing or joining do not leave the estimate stale."""
    budget = PrefillTimeBudget(2.0)
    budget.record(plan(4, 0), 0.014)
    assert budget.decode_step_seconds(28) == 0.014  # one batch size: its mean, no slope to see
    for decodes in (28, 16, 4, 8):
        budget.record(plan(decodes, 0), 0.010 + 0.001 * decodes)
    assert abs(budget.decode_step_seconds(2) - 0.012) < 1e-9
    assert abs(budget.decode_step_seconds(40) - 0.050) < 1e-9


def test_a_noisy_decode_line_never_falls_with_more_rows_nor_below_zero_without_rows():
    falling = PrefillTimeBudget(2.0)
    for decodes, seconds in ((2, 0.030), (20, 0.020)):
        falling.record(plan(decodes, 0), seconds)
    assert falling.decode_step_seconds(40) == falling.decode_step_seconds(1) == 0.025  # the mean
    steep = PrefillTimeBudget(2.0)
    for decodes, seconds in ((10, 0.010), (20, 0.030)):  # the line would cross zero at 5 decodes
        steep.record(plan(decodes, 0), seconds)
    assert steep.decode_step_seconds(0) == 0.0 and steep.decode_step_seconds(5) > 0


def test_the_limit_converges_to_what_keeps_a_step_within_the_slowdown():
    """Steps cost 20 ms plus 0.5 ms per prefill token: at 1.5x, 10 ms of prefill is 20 tokens."""
    budget = PrefillTimeBudget(1.5)
    budget.record(plan(16, 0), 0.020)
    for _ in range(40):
        tokens = budget.prefill_tokens(16)
        budget.record(plan(16, tokens), 0.020 + 0.0005 * tokens)
    assert budget.prefill_tokens(16) == 20


def test_a_mixed_step_faster_than_decoding_alone_teaches_nothing_and_the_limit_at_most_doubles():
    """A mixed step that took less than the decode-only estimate shows that estimate off for this
    batch (contexts changed), not prefill free: the cost per token stays; and however cheap prefill
    turns out, the limit grows at most 2x a step."""
    budget = PrefillTimeBudget(2.0)
    budget.record(plan(28, 0), 0.030)
    budget.record(plan(28, 28), 0.045)  # 0.5 ms a prefill token beyond the 30 ms
    assert budget.prefill_token_seconds == 0.015 / 28
    budget.record(plan(28, 56), 0.025)
    assert budget.prefill_token_seconds == 0.015 / 28 and budget.last_prefill_tokens == 28
    for _ in range(6):
        limit = budget.prefill_tokens(28)
        budget.record(plan(28, limit), 0.0301)  # implausibly cheap prefill: the limit still only doubles
        assert budget.prefill_tokens(28) <= 2 * limit


def test_a_limit_below_one_token_still_lets_a_prompt_progress():
    budget = PrefillTimeBudget(1.01)
    budget.record(plan(2, 0), 0.010)
    budget.record(plan(2, 4), 0.050)
    assert budget.prefill_tokens(2) == 1
