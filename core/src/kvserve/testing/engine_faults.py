"""Faults to inject into an engine, in its own process or not: ``AsyncLLM.from_config(config,
core_setup=FailingForward(flag))``. Each is a picklable callable run on the loaded engine, so it
reaches an engine core that a test cannot monkeypatch from outside."""

from __future__ import annotations

import os
import time
from typing import Any

from kvserve.sampling import SamplerStage


class FailingForward:
    """The model's forward raises ``RuntimeError("simulated device failure")`` once the file ``flag``
    exists (at once if ``flag`` is None); until then each forward first sleeps ``delay`` seconds
    (a tiny model is otherwise too quick to keep many requests in flight)."""

    def __init__(self, flag: str | None = None, delay: float = 0.0) -> None:
        self.flag = flag
        self.delay = delay

    def __call__(self, engine: Any) -> None:
        model = engine.runner.model
        forward = model.forward

        def failing_forward(*args: Any) -> Any:
            if self.flag is None or os.path.exists(self.flag):
                raise RuntimeError("simulated device failure")
            time.sleep(self.delay)
            return forward(*args)

        model.forward = failing_forward


class FailingSeed:
    """Sampling a request whose ``seed`` is ``seed`` raises: a bug confined to that request (a stage
    put first in the engine's sampler pipeline)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __call__(self, engine: Any) -> None:
        engine.sampler.stages.insert(0, _FailingSeedStage(self.seed))


class _FailingSeedStage(SamplerStage):
    name = "failing_seed"

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def wants(self, batch: Any) -> bool:
        return any(r.sampling_params.seed == self.seed for r in batch.requests)

    def apply(self, logits: Any, batch: Any) -> Any:
        for row, request in enumerate(batch.requests):
            if request.sampling_params.seed == self.seed:
                batch.fail(row, "sampling", RuntimeError("a bug in this request's sampling"))
        return logits
