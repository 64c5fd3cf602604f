"""The Executor interface: the engine's scheduler and KV manager stay in the driver; an executor
runs each step's plan on the model (its shards) and hands back rank 0's logits."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvserve.engine.model_runner import StepLogits
    from kvserve.interfaces import SchedulerOutput


@dataclass(frozen=True)
class WorkerInfo:
    """What the driver needs from the workers to size its KV manager."""

    num_kv_blocks: int
    """KV blocks (null block included) every rank's cache holds."""
    block_size: int
    attention_backend: str


class Executor(ABC):
    """Runs step plans on the model; one per engine."""

    @abstractmethod
    def execute(self, plan: SchedulerOutput) -> StepLogits:
        """One forward over every scheduled token of ``plan``: rank 0's logits where the plan needs
        them. Raises (naming the rank) when a worker failed or died; the engine then stops."""

    @abstractmethod
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks ``src -> dst`` in every layer of every rank's cache."""

    def shutdown(self) -> None:  # noqa: B027 - nothing to release in process
        """Stop every worker (idempotent); no worker process outlives it."""
