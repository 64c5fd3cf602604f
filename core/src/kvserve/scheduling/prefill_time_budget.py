"""A time-aware prefill budget (as in Sarathi-Serve): while requests decode, a step carries only
as many prefill tokens as keep it within ``max_decode_slowdown`` times a decode-only step.

A token budget alone cannot do this: what a prefill token costs against a decode step depends
on the model, the hardware and the context, so both are learnt from the engine's own step times.
"""

from __future__ import annotations

from kvserve.interfaces.scheduler import SchedulerOutput

SMOOTHING = 0.25
"""Weight of the newest step in the running averages: follows drift within a few steps, while one
step slowed by the machine moves the estimate a quarter of the way."""


def split_tokens(output: SchedulerOutput) -> tuple[int, int]:
    """(requests decoding, prefill tokens) of a planned step (see ``ScheduledRequest.decodes``)."""
    decodes = prefill = 0
    for item in output.scheduled:
        if item.decodes:
            decodes += 1
        else:
            prefill += item.num_tokens
    return decodes, prefill


class PrefillTimeBudget:
    """Running estimates of a decode-only step's seconds and of the seconds a prefill token adds
    to a step that also decodes; from them, the prefill tokens a step may carry.

    Until a decode-only step has been measured there is no limit, so a scheduler whose engine
    reports no step times behaves as without this budget. The limit at most doubles from one step
    that prefills to the next: an estimate thrown low (the decode-only time it subtracts is from a
    batch that has since changed) then costs one step twice as long, not a chunk of the whole budget.
    """

    def __init__(self, max_slowdown: float) -> None:
        """``max_slowdown`` (> 1): the most a step that decodes may take, as a multiple of a decode-only step."""
        self.max_slowdown = max_slowdown
        self.decode_step_seconds: float | None = None
        self.prefill_token_seconds: float | None = None
        self.last_prefill_tokens: int | None = None
        """Prefill tokens of the last measured step that also decoded."""

    def prefill_tokens(self, num_decodes: int) -> int | None:
        """Most prefill tokens for a step that decodes ``num_decodes`` requests (at least 1, so prompts
        progress); None when there is no limit: nothing decodes, or no decode-only step is measured yet.

        Before any mixed step is measured, a prefill token is taken to cost what a decode token does
        in a decode-only step (the step over its decodes): an overestimate where decoding is bound by
        reading the weights, so the first chunk errs small.
        """
        if num_decodes == 0 or self.decode_step_seconds is None:
            return None
        per_token = self.prefill_token_seconds or self.decode_step_seconds / num_decodes
        limit = max(1, int((self.max_slowdown - 1) * self.decode_step_seconds / per_token))
        return limit if self.last_prefill_tokens is None else min(limit, 2 * self.last_prefill_tokens)

    def record(self, output: SchedulerOutput, seconds: float) -> None:
        """Learn from a finished step: a decode-only step updates the decode estimate; a step with
        decodes and prefill tokens updates the prefill token's cost, as its time beyond a decode-only
        step. Steps that only prefill say nothing about either and are ignored.

        A step with prefill that took less than the decode estimate shows that estimate stale (fewer
        requests decode than when it was measured): it drops to the step's time less its prefill at
        the current cost per token (at least half the step), so that prefill does not look free.
        """
        decodes, prefill = split_tokens(output)
        if decodes == 0:
            return
        if prefill == 0:
            self.decode_step_seconds = _average(self.decode_step_seconds, seconds)
        elif self.decode_step_seconds is not None:
            if seconds < self.decode_step_seconds:
                prefill_seconds = (self.prefill_token_seconds or 0.0) * prefill
                self.decode_step_seconds = max(seconds - prefill_seconds, 0.5 * seconds)
            # Floored: noise must not make prefill tokens look free, which would lift the limit.
            extra = max(seconds - self.decode_step_seconds, 0.01 * self.decode_step_seconds)
            self.prefill_token_seconds = _average(self.prefill_token_seconds, extra / prefill)
            self.last_prefill_tokens = prefill


def _average(previous: float | None, value: float) -> float:
    return value if previous is None else previous + SMOOTHING * (value - previous)
