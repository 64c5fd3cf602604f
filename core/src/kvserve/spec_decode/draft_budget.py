"""How many of its drafts each request verifies in a step: as many as raise the step's expected
output tokens per second, judged from what steps of each size have cost and how often each request's
drafts were accepted.

A draft is worth verifying when the tokens it is expected to add outweigh what computing one more
token costs the step. On a CPU a decode step streams every weight once whatever its few tokens, so a
single stream verifies every draft nearly for free; at batch 32 each drafted token makes the step
dearer, and drafts that are rarely accepted (plain chat) cost more than they save. Outputs never
depend on this: verification is exact whatever is verified.
"""

from __future__ import annotations

from collections.abc import Sequence

PRIOR_ACCEPTANCE = 0.5
"""A request's per-draft acceptance before any of its drafts were verified."""
ACCEPTANCE_MEMORY = 0.7
"""Weight of a request's acceptance so far against its latest verification (an exponential average)."""
COST_MEMORY = 0.9
"""Weight of a step size's cost so far against its latest step."""


def size_class(num_tokens: int) -> int:
    """Steps are costed per power-of-two class of their token count: 1, 2-3, 4-7, 8-15, ..."""
    return max(num_tokens, 1).bit_length()


class DraftBudget:
    """Trims each request's proposal to the drafts worth verifying in the next step.

    Each request's draft ``j`` (1-based) is taken to be accepted with probability ``a ** j``, ``a`` the
    request's recent per-draft acceptance. The drafts most likely accepted come first; the step takes as
    many as maximise ``(decoding rows + their expected accepted drafts) / cost(rows + drafts)``.
    ``cost`` is learnt from the steps the engine runs: per power-of-two class of step sizes, the average
    tokens and seconds of its recent steps, a point of the curve, and between points a straight line.
    Past the largest size seen a step costs as that one (optimism: the size is tried, then known), so
    the budget learns each machine's and model's curve.
    """

    def __init__(self) -> None:
        self.step_costs: dict[int, tuple[float, float]] = {}
        """Size class -> exponential averages of its steps' (tokens, seconds)."""
        self.acceptance: dict[str, float] = {}
        """Request id -> its per-draft acceptance, an exponential average over its verifications."""

    def record_step(self, num_tokens: int, seconds: float) -> None:
        """A step computing ``num_tokens`` tokens took ``seconds``."""
        size = size_class(num_tokens)
        tokens, spent = self.step_costs.get(size, (num_tokens, seconds))
        self.step_costs[size] = (
            COST_MEMORY * tokens + (1 - COST_MEMORY) * num_tokens,
            COST_MEMORY * spent + (1 - COST_MEMORY) * seconds,
        )

    def record_verification(self, request_id: str, num_drafts: int, num_accepted: int) -> None:
        """``request_id`` verified ``num_drafts`` drafts (at least one) and kept ``num_accepted``."""
        before = self.acceptance.get(request_id, PRIOR_ACCEPTANCE)
        latest = num_accepted / num_drafts
        self.acceptance[request_id] = ACCEPTANCE_MEMORY * before + (1 - ACCEPTANCE_MEMORY) * latest

    def forget(self, request_id: str) -> None:
        """``request_id`` finished."""
        self.acceptance.pop(request_id, None)

    def cost(self, num_tokens: int) -> float | None:
        """Expected seconds of a step of ``num_tokens`` tokens; None before any step was recorded."""
        points = sorted(self.step_costs.values())
        if not points:
            return None
        if num_tokens <= points[0][0]:
            return points[0][1]
        for (low, low_seconds), (high, high_seconds) in zip(points, points[1:]):
            if num_tokens <= high:
                return low_seconds + (high_seconds - low_seconds) * (num_tokens - low) / (high - low)
        return points[-1][1]

    def lengths(self, request_ids: Sequence[str], proposed: Sequence[int], num_rows: int) -> list[int]:
        """How many of its ``proposed[i]`` drafts request ``request_ids[i]`` verifies, in a step of
        ``num_rows`` tokens besides the drafts (its running requests' next tokens)."""
        if self.cost(num_rows) is None:
            return list(proposed)
        candidates = sorted(
            (
                (self.acceptance.get(request_id, PRIOR_ACCEPTANCE) ** j, i)
                for i, (request_id, count) in enumerate(zip(request_ids, proposed))
                for j in range(1, count + 1)
            ),
            reverse=True,
        )
        best_rate, best_count, expected = num_rows / self.cost(num_rows), 0, 0.0
        for count, (probability, _) in enumerate(candidates, start=1):
            expected += probability
            rate = (num_rows + expected) / self.cost(num_rows + count)
            if rate > best_rate:
                best_rate, best_count = rate, count
        lengths = [0] * len(proposed)
        for _, i in candidates[:best_count]:
            lengths[i] += 1
        return lengths
