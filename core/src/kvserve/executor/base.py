"""The Executor interface: the engine's scheduler and KV manager stay in the driver; an executor
runs each step's input on the model (its shards) and hands back rank 0's logits."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvserve.runner.model_runner import RunnerInfo
    from kvserve.runner.step_input import StepInput
    from kvserve.runner.step_logits import StepLogits


class Executor(ABC):
    """Runs step inputs on the model; one per engine. Constructed, it holds a runner on every rank."""

    info: RunnerInfo
    """What the driver sizes its KV manager from: under tensor parallelism, rank 0's runner with
    the smallest cache of any rank."""
    rank_infos: list[RunnerInfo]
    """Each rank's own runner info, by rank (one entry in process)."""

    @abstractmethod
    def execute(self, step: StepInput) -> StepLogits:
        """One forward over every token of ``step`` on every rank: rank 0's logits. Raises (naming
        the rank) when a worker failed or died; the engine then stops."""

    def shutdown(self) -> None:  # noqa: B027 - nothing to release in process
        """Stop every worker (idempotent); no worker process outlives it."""
