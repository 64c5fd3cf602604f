"""Entry point: ``[project.entry-points.kvserve] example_platform = "kvserve_example_platform.plugin"``."""

from kvserve import hookimpl


@hookimpl
def register_platforms(register):
    # Below the real CPU platform (priority 0), so platform="auto" never picks the example.
    register("example_cpu", "kvserve_example_platform.platform:FixedBudgetCpuPlatform", priority=-10)
