"""First come, first served: admit in arrival order, preempt the latest admitted request."""

from __future__ import annotations

from kvserve.request import Request
from kvserve.scheduling import BatchingScheduler


class FifoScheduler(BatchingScheduler):
    name = "fifo"

    def admission_key(self, request: Request) -> float:
        return request.arrival_time

    def preemption_victim(self, running: list[Request]) -> Request:
        return running[-1]
