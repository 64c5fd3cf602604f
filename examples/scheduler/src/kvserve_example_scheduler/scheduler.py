"""Shortest prompt first: short requests are admitted ahead of long ones (ties by arrival), and
when blocks run out the longest running sequence is preempted (it frees the most blocks)."""

from __future__ import annotations

from kvserve.request import Request
from kvserve.scheduling import BatchingScheduler


class ShortestPromptFirstScheduler(BatchingScheduler):
    """Only the policy: token budget, chunked prefill and preemption are core's BatchingScheduler."""

    name = "shortest_first"

    def admission_key(self, request: Request) -> int:
        return request.num_prompt_tokens  # fixed while the request waits, as the queue requires

    def preemption_victim(self, running: list[Request]) -> Request:
        return max(running, key=lambda r: (r.num_tokens, self.arrival_order(r)))
