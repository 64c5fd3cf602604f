"""Entry point: ``[project.entry-points.kvserve] example_scheduler = "kvserve_example_scheduler.plugin"``."""

from kvserve import hookimpl


@hookimpl
def register_schedulers(register):
    # Below FIFO (priority 10): scheduler="auto" keeps first come, first served.
    register("shortest_first", "kvserve_example_scheduler.scheduler:ShortestPromptFirstScheduler", priority=-10)
