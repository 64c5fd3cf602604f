"""Priority scheduling: lower ``Request.priority`` first (as in vLLM), ties by arrival.

Admission follows priority; when blocks run out the victim is the least urgent running
request (the latest arrival among equals), and a waiting request preempts running ones
that are strictly less urgent. There is no aging: a steady stream of urgent requests can
starve less urgent ones, which is what strict priorities mean.
"""

from __future__ import annotations

from kvserve.request import Request
from kvserve.scheduling import BatchingScheduler


class PriorityScheduler(BatchingScheduler):
    name = "priority"

    def admission_key(self, request: Request) -> int:
        return request.priority

    def preemption_victim(self, running: list[Request]) -> Request:
        return max(running, key=lambda r: (r.priority, self.arrival_order(r)))

    def may_preempt_for(self, request: Request, victim: Request) -> bool:
        return request.priority < victim.priority
