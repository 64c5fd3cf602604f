"""The CPU platform's SamplingKernel: the draw of each sampled row as one fused C++ pass.

The kernel (``csrc/sampling.cpp``) is built on first use by ``kvserve_cpu_native`` (``-march=native``,
OpenMP; cached) and registered as ``torch.ops.kvserve_cpu_sampling.draw``. Where it cannot be
built, core's PyTorch kernel runs and the start-up line says why.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import ClassVar

import torch

from kvserve.interfaces import SamplingKernel
from kvserve.sampling.torch_kernel import TorchSamplingKernel
from kvserve_cpu_native import unavailable_reason

logger = logging.getLogger("kvserve")

LIBRARY = "kvserve_cpu_sampling"
SOURCES = (Path(__file__).parent / "csrc" / "sampling.cpp",)


class NativeSamplingKernel(SamplingKernel):
    """:class:`SamplingKernel` through the C++ operator (built and loaded before construction): float32
    CPU tensors; anything else is refused with a ``RuntimeError`` naming the argument."""

    name: ClassVar[str] = "cpu-native"

    def __init__(self) -> None:
        self._draw = getattr(torch.ops, LIBRARY).draw.default

    def draw(
        self,
        logits: torch.Tensor,
        temperature: torch.Tensor,
        min_p: torch.Tensor,
        top_p: torch.Tensor,
        uniform: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._draw(logits, temperature, min_p, top_p, uniform)


def cpu_sampling_kernel() -> SamplingKernel:
    """The native kernel, built (or found in the cache) now; core's PyTorch one, with the reason,
    where the build is unavailable or fails."""
    reason = unavailable_reason(LIBRARY, SOURCES)
    if reason is not None:
        logger.warning("kvserve-platform-cpu: native sampling kernel unavailable, using PyTorch's: %s", reason)
        return TorchSamplingKernel(reason=f"native sampling kernel unavailable: {reason.splitlines()[0]}")
    return NativeSamplingKernel()
