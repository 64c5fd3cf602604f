"""One tensor-parallel rank, as the multiprocess executor's worker processes and the Ray executor's
actors both run it.

A worker joins the torch.distributed group over the platform's backend, builds its runner (its
shard of the model, backend and KV cache: :func:`~kvserve.runner.build.build_runner`; plugins load
there through entry points, as in any process importing kvserve) and runs one torch thread; then
it runs each step's :class:`~kvserve.runner.step_input.StepInput` as the driver sent it. Only
rank 0 hands logits back, in host memory, so the driver needs no device of its own.
"""

from __future__ import annotations

import os
import socket

from kvserve.config import EngineConfig
from kvserve.runner.model_runner import ModelRunner, RunnerInfo
from kvserve.runner.step_input import StepInput
from kvserve.runner.step_logits import StepLogits

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
    ) -> RunnerInfo:
        """Join the group of ``world_size`` at ``init_method`` (``tcp://host:port``, on rank 0's
        machine) as ``rank`` over ``backend``, its device the one of index ``local_rank`` among
        those this process sees, then build the shard; returns what the driver sizes its KV
        manager from. Blocks until every rank has joined."""
        import torch

        from kvserve import distributed
        from kvserve.components import resolve_platform
        from kvserve.loader import open_model
        from kvserve.logging_setup import configure_logging
        from kvserve.runner.build import build_runner
        from kvserve.runner.model_settings import ModelSettings

        configure_logging()
        torch.set_num_threads(1)
        self.rank = rank
        distributed.init(rank, world_size, backend, init_method, local_rank)
        platform = resolve_platform(config)
        source = open_model(config.model.model, config.model.tokenizer)
        settings = ModelSettings.resolve(config, platform, source.hf_config)
        platform.seed_everything(config.model.seed)
        self.runner = build_runner(config, platform, source, settings)
        return self.runner.info

    def execute(self, step: StepInput) -> StepLogits | None:
        """Run one step on the shard: rank 0's logits (on the CPU), None on other ranks."""
        logits = self.runner.execute(step)
        return logits.to("cpu") if self.rank == 0 else None

    def pid(self) -> int:
        """This worker's process id."""
        return os.getpid()

    def stop(self) -> None:
        """Leave the group (the process may then exit)."""
        from kvserve import distributed

        distributed.destroy()
