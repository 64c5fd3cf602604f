"""Entry point of kvserve-scheduler-fifo."""

from kvserve import hookimpl


@hookimpl
def register_schedulers(register):
    register("fifo", "kvserve_scheduler_fifo.scheduler:FifoScheduler", priority=10)
