"""The in-process executor: the engine's own ModelRunner (one device, no tensor parallelism)."""

from __future__ import annotations

from kvserve.executor.base import Executor
from kvserve.runner.model_runner import ModelRunner
from kvserve.runner.step_input import StepInput
from kvserve.runner.step_logits import StepLogits


class InProcessExecutor(Executor):
    """Runs each step on ``runner`` in the calling thread."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.info = runner.info
        self.rank_infos = [runner.info]

    def execute(self, step: StepInput) -> StepLogits:
        return self.runner.execute(step)
