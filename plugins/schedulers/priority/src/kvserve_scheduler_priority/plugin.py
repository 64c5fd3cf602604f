"""Entry point of kvserve-scheduler-priority."""

from kvserve import hookimpl
from kvserve.hookspecs import Register


@hookimpl
def register_schedulers(register: Register) -> None:
    # Below fifo (10): ``scheduler=auto`` keeps first come, first served.
    register("priority", "kvserve_scheduler_priority.scheduler:PriorityScheduler", priority=5)
