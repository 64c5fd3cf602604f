"""kvserve-scheduler-fifo passes the scheduler contract, with FIFO's policy stated independently."""

from kvserve.testing import SchedulerContract


class TestFifoScheduler(SchedulerContract):
    """First come, first served: admission in arrival order; the latest admitted request is preempted."""

    scheduler = "fifo"

    def policy_key(self, scheduler, request):
        return request.arrival_time

    def expected_victim(self, scheduler, running):
        return running[-1]
