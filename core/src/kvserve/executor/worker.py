"""One tensor-parallel rank, as the multiprocess executor's worker processes and the Ray executor's
actors both run it.

A worker joins the torch.distributed group over the platform's backend, builds its shard of the
model with its own in-process engine (plugins load there through entry points, as in any process
importing kvserve) and runs one torch thread; then it runs each step's :class:`StepInput`. Only
rank 0 hands logits back, in host memory, so the driver needs no device of its own.
"""

from __future__ import annotations

import dataclasses
import os
import socket

from kvserve.config import EngineConfig
from kvserve.engine.model_runner import ModelRunner, StepLogits
from kvserve.executor.base import WorkerInfo
from kvserve.executor.step_input import StepInput

START_TIMEOUT_S = 600.0
"""How long a worker may take to build its shard (load weights, profile) before the driver gives up."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now, for rank 0's rendezvous."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class Worker:
    """One rank's model shard. Constructing it does nothing, so that a Ray actor exists (and can
    say where it runs) before the ranks rendezvous in :meth:`start`."""

    def __init__(self) -> None:
        self.rank = 0
        self.runner: ModelRunner | None = None

    def start(
        self, rank: int, world_size: int, local_rank: int, backend: str, init_method: str, config: EngineConfig
    ) -> WorkerInfo:
        """Join the group of ``world_size`` at ``init_method`` (``tcp://host:port``, on rank 0's
        machine) as ``rank`` over ``backend``, its device the one of index ``local_rank`` among
        those this process sees, then build the shard; returns what the driver sizes its KV
        manager from. Blocks until every rank has joined."""
        import torch

        from kvserve import distributed
        from kvserve.engine.llm_engine import LLMEngine

        torch.set_num_threads(1)
        self.rank = rank
        distributed.init(rank, world_size, backend, init_method, local_rank)
        engine = LLMEngine(config)
        self.runner = engine.runner
        return WorkerInfo(engine.num_kv_blocks, self.runner.block_size, self.runner.backend.name)

    def execute(self, step: StepInput) -> StepLogits | None:
        """Run one step's plan on the shard: rank 0's logits (on the CPU), None on other ranks."""
        plan, self.runner.kv_cache_manager = step.plan()
        logits = self.runner.execute(plan)
        if self.rank != 0:
            return None
        return dataclasses.replace(
            logits,
            logits=logits.logits.to("cpu"),
            prompt_logits={i: t.to("cpu") for i, t in logits.prompt_logits.items()},
        )

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks ``src -> dst`` in every layer of this rank's cache."""
        self.runner.copy_blocks(pairs)

    def pid(self) -> int:
        """This worker's process id."""
        return os.getpid()

    def stop(self) -> None:
        """Leave the group (the process may then exit)."""
        from kvserve import distributed

        distributed.destroy()
