"""Continuous batching: token budget, max sequences, chunked prefill, recompute preemption.

A scheduler plugin subclasses :class:`BatchingScheduler` and supplies only the policy:
the order of the waiting queue and which running request to preempt.
"""

from __future__ import annotations

import bisect
import itertools
from abc import abstractmethod
from typing import Any

from kvserve.interfaces.scheduler import ScheduledRequest, Scheduler, SchedulerOutput
from kvserve.request import Request, RequestStatus


class BatchingScheduler(Scheduler):
    """Each step: running requests first (decodes and unfinished prefill chunks), then, if no
    one had to be preempted, waiting requests in policy order while budget and blocks last."""

    @abstractmethod
    def admission_key(self, request: Request) -> Any:
        """Sort key of the waiting queue: smaller is admitted first (ties: arrival order)."""

    @abstractmethod
    def preemption_victim(self, running: list[Request]) -> Request:
        """The running request to preempt when blocks run out (``running`` is in admission order)."""

    def __init__(self, config, kv_cache, max_model_len: int) -> None:
        super().__init__(config, kv_cache, max_model_len)
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self._arrival = itertools.count()
        self._arrival_index: dict[str, int] = {}

    def _queue_key(self, request: Request) -> tuple[Any, int]:
        return self.admission_key(request), self._arrival_index[request.request_id]

    def add_request(self, request: Request) -> None:
        self._arrival_index[request.request_id] = next(self._arrival)
        request.status = RequestStatus.WAITING
        bisect.insort(self.waiting, request, key=self._queue_key)

    def abort_request(self, request_id: str) -> Request | None:
        for queue in (self.waiting, self.running):
            for request in queue:
                if request.request_id == request_id:
                    queue.remove(request)
                    self._finish(request, RequestStatus.FINISHED_ABORTED)
                    return request
        return None

    def schedule(self) -> SchedulerOutput:
        output = SchedulerOutput()
        scheduled: dict[str, ScheduledRequest] = {}
        budget = self.config.max_num_batched_tokens

        for request in list(self.running):
            if request.status is not RequestStatus.RUNNING or budget == 0:
                continue  # preempted earlier in this loop, or no budget left
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            while not self.kv_cache.allocate_slots(request, num_new):
                victim = self.preemption_victim(self.running)
                self._preempt(victim, output)
                if victim.request_id in scheduled:
                    budget += scheduled.pop(victim.request_id).num_tokens
                if victim is request:
                    break
            else:
                scheduled[request.request_id] = ScheduledRequest(request, request.num_computed_tokens, num_new)
                budget -= num_new

        while self.waiting and not output.preempted and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            cached = self.kv_cache.num_cached_tokens(request)
            remaining = request.num_tokens - cached
            num_new = min(remaining, budget)
            if num_new < remaining and not self.config.enable_chunked_prefill:
                break
            request.num_computed_tokens = cached
            if not self.kv_cache.allocate_slots(request, num_new, cached):
                request.num_computed_tokens = 0
                break
            self.waiting.pop(0)
            self.running.append(request)
            request.status = RequestStatus.RUNNING
            scheduled[request.request_id] = ScheduledRequest(request, cached, num_new)
            budget -= num_new

        output.scheduled = list(scheduled.values())
        return output

    def update(self, output: SchedulerOutput, sampled: list[int]) -> list[Request]:
        finished = []
        for item, token in zip(output.scheduled, sampled):
            request = item.request
            if request.status is not RequestStatus.RUNNING:
                continue  # aborted while the step ran
            completes = item.completes_sequence
            request.num_computed_tokens += item.num_tokens
            if completes:
                request.append_token(token, self.max_model_len)
                if request.status.finished:
                    self.running.remove(request)
                    self._finish(request, request.status)
                    finished.append(request)
        return finished

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def num_waiting(self) -> int:
        return len(self.waiting)

    def num_running(self) -> int:
        return len(self.running)

    def _preempt(self, request: Request, output: SchedulerOutput) -> None:
        """Recompute preemption: drop the KV, queue the request to prefill prompt + output again."""
        self.running.remove(request)
        self.kv_cache.free(request)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = RequestStatus.PREEMPTED
        bisect.insort(self.waiting, request, key=self._queue_key)
        output.preempted.append(request)

    def _finish(self, request: Request, status: RequestStatus) -> None:
        self.kv_cache.free(request)
        self._arrival_index.pop(request.request_id, None)
        request.status = status
