"""kvserve-scheduler-priority passes the scheduler contract, with its policy stated independently."""

from kvserve.testing import SchedulerContract


class TestPriorityScheduler(SchedulerContract):
    """Lower ``priority`` first, ties by arrival; the victim is the least urgent, latest-arrived running request."""

    scheduler = "priority"

    def policy_key(self, scheduler, request):
        return (request.priority, request.arrival_time)

    def expected_victim(self, scheduler, running):
        return max(running, key=lambda r: (r.priority, r.arrival_time))
