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
