"""The model's forward under ``torch.compile`` (inductor), one graph per token-count bucket.

A decode-sized step's token count is padded up to the next bucket (powers of two up to the
largest decode step), so a handful of graphs serve every decode step and none is recompiled
mid-run. Larger steps (prefills) run the model eagerly, unpadded: their GEMMs dwarf the Python
around them, which is what compiling removes, and each of their buckets would cost a compile
(~20 s for a 125M model on two cores) for no gain. The runner compiles every bucket at start-up
(:meth:`~kvserve.runner.model_runner.ModelRunner.compile_buckets`), so no step waits on a compile.
Attention stays outside the graphs as the opaque ``kvserve::paged_attention`` op (see
:mod:`kvserve.layers.attention`): everything the graphs see depends on the token count only.
Linear layers a platform's
:class:`~kvserve.interfaces.LinearKernel` packed call it inside the graphs (the packed weights are
graph inputs), as they do eagerly. Compiled code is cached on disk
(inductor's FX graph and AOT autograd caches, under ``compile_cache_dir``), so a second start
with the same model and settings loads instead of compiling.
"""

from __future__ import annotations

import logging
import os
import time
import types
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from kvserve.forward_context import ForwardContext, current_forward_context

logger = logging.getLogger("kvserve")

DEFAULT_CACHE_DIR = Path("~/.cache/kvserve/inductor")


def token_buckets(max_tokens: int) -> tuple[int, ...]:
    """Powers of two below ``max_tokens``, then ``max_tokens`` itself."""
    buckets = [1]
    while buckets[-1] * 2 < max_tokens:
        buckets.append(buckets[-1] * 2)
    return tuple(dict.fromkeys([*buckets, max_tokens]))


def own_forward(model: torch.nn.Module) -> Any:
    """``model.forward`` on a code object of its own: dynamo keeps its graphs per code object, so
    every engine's model (another model of the same class, other settings) gets graphs of its own,
    and none can run another's (whose weights a frozen graph holds as constants)."""
    f = type(model).forward
    own = types.FunctionType(f.__code__.replace(), f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    return types.MethodType(own, model)


class CompiledForward:
    """``model.forward`` compiled per bucket of :func:`token_buckets` (``max_tokens``: the most tokens
    a decode step holds); steps of more tokens are not its (:meth:`runs`).

    ``freezing``: inductor folds the weights into the graphs as constants and, on the CPU,
    prepacks for oneDNN/MKL the linear layers' weights the platform's kernel left dense.
    """

    def __init__(self, model: torch.nn.Module, max_tokens: int, freezing: bool, cache_dir: str | None) -> None:
        import torch._dynamo
        import torch._inductor.config

        # Inductor reads it at each compile, so setting it before the first one is enough.
        if cache_dir is not None:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(cache_dir).expanduser())
        else:
            os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(DEFAULT_CACHE_DIR.expanduser()))
        self.buckets = token_buckets(max_tokens)
        # One graph per bucket: allow that many specializations of the one forward.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, len(self.buckets) + 1)
        self.freezing = freezing
        self.cache_dir = os.environ["TORCHINDUCTOR_CACHE_DIR"]
        self._compiled = torch.compile(
            own_forward(model),
            backend="inductor",
            fullgraph=True,
            dynamic=False,
            # Dynamo checks its guards before every call; those on the model's modules (every attribute
            # the trace read, ~13,000 on SmolLM2) took 0.8 ms of a 6.5 ms one-stream decode step. The
            # model does not change once built (its weights change in place), and own_forward keeps
            # engines from sharing graphs, so only the guards on the inputs and global state remain.
            options={"freezing": freezing, "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe},
        )
        self.compile_seconds: dict[int, float] = {}
        """Bucket -> seconds its first call took (compiling, or loading from the cache)."""

    def runs(self, num_tokens: int) -> bool:
        """Whether a step of ``num_tokens`` (padded) tokens runs compiled, not eagerly."""
        return num_tokens <= self.buckets[-1]

    def padded_tokens(self, num_tokens: int) -> int:
        """The bucket a step of ``num_tokens`` runs in; ``num_tokens`` itself above the largest (eager)."""
        return next((bucket for bucket in self.buckets if bucket >= num_tokens), num_tokens)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> Any:
        """Hidden states of the bucket-padded tokens (a step it :meth:`runs`); the first call of a
        bucket compiles it."""
        num_tokens = input_ids.shape[0]
        first = num_tokens not in self.compile_seconds
        start = time.perf_counter()
        # Dynamo reads ``freezing`` from inductor's global config when it traces (not from the options).
        settings = torch._inductor.config.patch(freezing=self.freezing) if first else nullcontext()
        with settings, current_forward_context(ctx):
            hidden = self._compiled(input_ids, positions, ctx)
        if first:
            self.compile_seconds[num_tokens] = seconds = time.perf_counter() - start
            logger.info(
                "kvserve compile: %d-token graph ready in %.1f s (cache %s)", num_tokens, seconds, self.cache_dir
            )
        return hidden

    def describe(self) -> str:
        """E.g. ``compiled: inductor, freezing, 6 token buckets 1..32 (larger steps eager), 2 ready after 30.1 s``."""
        freezing = ", freezing" if self.freezing else ""
        ready = len(self.compile_seconds)
        return (
            f"compiled: inductor{freezing}, {len(self.buckets)} token buckets {self.buckets[0]}..{self.buckets[-1]} "
            f"(larger steps eager), {ready} ready after {sum(self.compile_seconds.values()):.1f} s"
        )
