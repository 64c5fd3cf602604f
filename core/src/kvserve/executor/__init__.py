"""Executors: what runs the model for the engine's step inputs (in this process, or one worker
process per tensor-parallel rank)."""

from kvserve.executor.base import Executor
from kvserve.executor.in_process import InProcessExecutor

__all__ = ["Executor", "InProcessExecutor"]
