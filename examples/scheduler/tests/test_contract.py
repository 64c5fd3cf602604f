"""The example scheduler passes the scheduler contract, with its policy stated independently."""

from kvserve.testing import SchedulerContract


class TestShortestPromptFirstScheduler(SchedulerContract):
    """Admission by prompt length then arrival; the longest sequence (latest on ties) is preempted."""

    scheduler = "shortest_first"

    def policy_key(self, scheduler, request):
        return (request.num_prompt_tokens, request.arrival_time)

    def expected_victim(self, scheduler, running):
        return max(running, key=lambda r: (r.num_tokens, r.arrival_time))
