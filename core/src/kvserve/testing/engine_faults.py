"""Faults to inject into an engine, in its own process or not: ``AsyncLLM.from_config(config,
core_setup=FailingForward(flag))``. Each is a picklable callable run on the loaded engine, so it
reaches an engine core that a test cannot monkeypatch from outside."""

from __future__ import annotations

import os
import time
from typing import Any

from kvserve.engine import sampler


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
    """Sampling a request whose ``seed`` is ``seed`` raises: a bug confined to that request."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __call__(self, engine: Any) -> None:
        process_row = sampler._process_row

        def process_row_unless_seed(logits: Any, row: int, request: Any) -> None:
            if request.sampling_params.seed == self.seed:
                raise RuntimeError("a bug in this request's sampling")
            process_row(logits, row, request)

        sampler._process_row = process_row_unless_seed
