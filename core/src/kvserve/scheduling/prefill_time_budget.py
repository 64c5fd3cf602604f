"""A time-aware prefill budget (as in Sarathi-Serve): while requests decode, a step carries only
as many prefill tokens as keep it within ``max_decode_slowdown`` times a decode-only step, unless a
burst of prompts that one step takes whole outnumbers the decodes.

A token budget alone cannot do this: what a prefill token costs against a decode step depends
on the model, the hardware and the context, so both are learnt from the engine's own step times.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable

from kvserve.interfaces.scheduler import SchedulerOutput

SMOOTHING = 0.25
"""Weight of the newest step in the running average of a prefill token's cost: follows drift within
a few steps, while one step slowed by the machine moves the estimate a quarter of the way."""

DECODE_WINDOW = 32
"""Decode-only steps the decode-time line is fitted to: enough batch sizes to see the cost per row,
recent enough to follow growing contexts."""


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
    """Estimates of a decode-only step's seconds as a function of how many requests decode, and of
    the seconds a prefill token adds to a step that also decodes; from them, the prefill tokens a
    step may carry.

    A decode-only step costs a fixed part (reading the weights) plus a part per decoding row, so
    its time is a line through the recent decode-only steps' (decodes, seconds): an estimate from a
    batch of another size still holds when decodes finish or join. Until a decode-only step has
    been measured there is no limit, so a scheduler whose engine reports no step times behaves as
    without this budget. The limit at most doubles from one step that prefills to the next: an
    estimate thrown low then costs one step twice as long, not a chunk of the whole budget.
    """

    def __init__(self, max_slowdown: float) -> None:
        """``max_slowdown`` (> 1): the most a step that decodes may take, as a multiple of a decode-only step."""
        self.max_slowdown = max_slowdown
        self.decode_steps: deque[tuple[int, float]] = deque(maxlen=DECODE_WINDOW)
        """(requests decoding, seconds) of recent decode-only steps."""
        self.prefill_token_seconds: float | None = None
        """Running average over the steps that decoded and prefilled."""
        self.prefill_only_token_seconds: float | None = None
        """Seconds per token of the first step that only prefilled: the first guess, until a mixed step is measured."""
        self.last_prefill_tokens: int | None = None
        """Prefill tokens of the last measured step that also decoded."""

    def decode_step_seconds(self, num_decodes: int) -> float | None:
        """Estimated seconds of a step that only decodes ``num_decodes`` requests; None before any
        decode-only step is measured. While the measured steps all decoded as many requests, their
        mean; a fitted line never falls with more rows, nor below zero without rows."""
        if not self.decode_steps:
            return None
        counts, times = zip(*self.decode_steps)
        try:
            slope, intercept = statistics.linear_regression(counts, times)
        except statistics.StatisticsError:  # a single batch size: no slope to see
            return statistics.fmean(times)
        if slope < 0:  # noise: more rows cannot cost less
            return statistics.fmean(times)
        if intercept < 0:  # through the origin instead
            slope, intercept = sum(c * t for c, t in self.decode_steps) / sum(c * c for c in counts), 0.0
        return intercept + slope * num_decodes

    def prefill_tokens(self, num_decodes: int, prefills: Iterable[int] = (), token_budget: int = 0) -> int | None:
        """Most prefill tokens for a step that decodes ``num_decodes`` requests while others wait for
        (the rest of) their prompts, ``prefills`` tokens each: at least 1, so prompts progress. None
        when there is no limit: nothing decodes, no decode-only step is measured yet, or the prompts
        are a burst that one step of ``token_budget`` tokens takes whole and they outnumber the
        decodes (holding it back would delay more users than it spares, for one step's stall).

        Before any mixed step is measured, a prefill token is taken to cost what it did in a step that
        only prefilled (that step's fixed costs included, so an overestimate) or, without one, what a
        decode token does in a decode-only step: either way the first chunk errs small.
        """
        if _one_step_burst(num_decodes, prefills, token_budget):
            return None
        decode_seconds = self.decode_step_seconds(num_decodes) if num_decodes else None
        if decode_seconds is None:
            return None
        per_token = self.prefill_token_seconds or self.prefill_only_token_seconds or decode_seconds / num_decodes
        limit = max(1, int((self.max_slowdown - 1) * decode_seconds / per_token))
        return limit if self.last_prefill_tokens is None else min(limit, 2 * self.last_prefill_tokens)

    def record(self, output: SchedulerOutput, seconds: float) -> None:
        """Learn from a finished step: a decode-only step joins the decode-time fit; a step with
        decodes and prefill tokens updates the prefill token's cost, as its time beyond the
        decode-only estimate for as many decodes (unless it took less: then that estimate is off for
        this batch, and the step says nothing); a step that only prefills gives that cost its first
        guess."""
        decodes, prefill = split_tokens(output)
        if decodes == 0:
            if prefill and self.prefill_only_token_seconds is None:
                self.prefill_only_token_seconds = seconds / prefill
            return
        if prefill == 0:
            self.decode_steps.append((decodes, seconds))
            return
        decode_seconds = self.decode_step_seconds(decodes)
        if decode_seconds is None or seconds <= decode_seconds:
            return  # faster than decoding alone: the decode estimate is off for this batch, not prefill free
        # Floored: noise must not make prefill tokens look free, which would lift the limit.
        extra = max(seconds - decode_seconds, 0.01 * decode_seconds)
        self.prefill_token_seconds = _average(self.prefill_token_seconds, extra / prefill)
        self.last_prefill_tokens = prefill


def _one_step_burst(num_decodes: int, prefills: Iterable[int], token_budget: int) -> bool:
    """Whether more prompts wait than requests decode and all of them fit in one step's budget."""
    count = total = 0
    for tokens in prefills:
        count, total = count + 1, total + tokens
        if total > token_budget:
            return False
    return count > num_decodes


def _average(previous: float | None, value: float) -> float:
    return value if previous is None else previous + SMOOTHING * (value - previous)
