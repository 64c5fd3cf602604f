"""The in-process executor: the engine's own ModelRunner (one device, no tensor parallelism)."""

from __future__ import annotations

from kvserve.engine.model_runner import ModelRunner, StepLogits
from kvserve.executor.base import Executor
from kvserve.interfaces import SchedulerOutput


class InProcessExecutor(Executor):
    """Runs the plan on ``runner`` in the calling thread."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    def execute(self, plan: SchedulerOutput) -> StepLogits:
        return self.runner.execute(plan)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        self.runner.copy_blocks(pairs)
