"""Deliberately broken copies of the FIFO scheduler: each breaks one rule of the contract.

Test fixtures for ``core/tests/test_contract_mutants.py``, which asserts that the scheduler
contract fails each of them with a message naming the broken behaviour.
"""

from __future__ import annotations

from kvserve.request import RequestStatus
from kvserve_scheduler_fifo.scheduler import FifoScheduler


class OverBudget(FifoScheduler):
    """Plans every step with twice the configured token budget."""

    name = "fifo_over_budget"

    def schedule(self):
        configured = self.config
        self.config = configured.model_copy(update={"max_num_batched_tokens": 2 * configured.max_num_batched_tokens})
        try:
            return super().schedule()
        finally:
            self.config = configured


class LeaksOnAbort(FifoScheduler):
    """Drops an aborted request from its queue without freeing its KV blocks."""

    name = "fifo_leaks_on_abort"

    def abort_request(self, request_id: str):
        for queue in (self.waiting, self.running):
            for request in queue:
                if request.request_id == request_id:
                    queue.remove(request)
                    request.status = RequestStatus.FINISHED_ABORTED
                    return request
        return None


class AppendsPastStop(FifoScheduler):
    """Appends every accepted token of a step, those after a stop (EOS, ``max_tokens``) included."""

    name = "fifo_appends_past_stop"

    def update(self, output, accepted):
        finished = []
        for item, tokens in zip(output.scheduled, accepted):
            request = item.request
            if request.status is not RequestStatus.RUNNING:
                continue
            if not item.completes_sequence:
                request.num_computed_tokens += item.num_tokens
                continue
            for token in tokens:
                request.append_token(token, self.max_model_len)  # no break at a stop
            request.num_computed_tokens = request.num_tokens - 1
            if item.num_lookahead:
                self.kv_cache.truncate(request, request.num_computed_tokens)
            if request.status.finished:
                self.running.remove(request)
                self._finish(request, request.status)
                finished.append(request)
        return finished


class AdmitsBeforeReady(FifoScheduler):
    """Ignores ``Request.ready_when``: admits a request whose grammar is still compiling."""

    name = "fifo_admits_before_ready"

    def schedule(self):
        for request in self.waiting:
            request.ready_when = None
        return super().schedule()
