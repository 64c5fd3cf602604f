"""The CPU platform's LayerOps: RMSNorm, add+RMSNorm, SiLU-and-mul and rotary as fused C++ operators.

The kernels (``csrc/layer_ops.cpp``) are built on first use by ``kvserve_cpu_native`` (``-march=native``,
OpenMP; cached, so only a machine's first start pays the few seconds) and registered as
``torch.ops.kvserve_cpu_layer_ops.*``. Where they cannot be built, core's PyTorch ops run and the
start-up line says why.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import ClassVar

import torch

from kvserve.interfaces import LayerOps
from kvserve.layers import TorchLayerOps
from kvserve_cpu_native import unavailable_reason

logger = logging.getLogger("kvserve")

LIBRARY = "kvserve_cpu_layer_ops"
SOURCES = (Path(__file__).parent / "csrc" / "layer_ops.cpp",)


class NativeLayerOps(LayerOps):
    """:class:`LayerOps` through the C++ operators (built and loaded before construction): float32,
    bfloat16 and float16 on CPU tensors; inputs whose last dimension is not contiguous are copied
    first, wrong shapes or dtypes are refused with a ``RuntimeError`` naming the argument."""

    name: ClassVar[str] = "cpu-native"

    def __init__(self) -> None:
        ops = getattr(torch.ops, LIBRARY)
        # The overloads themselves: calling them skips the packet's overload resolution.
        self._rms_norm = ops.rms_norm.default
        self._fused_add_rms_norm = ops.fused_add_rms_norm.default
        self._silu_and_mul = ops.silu_and_mul.default
        self._rotary_embedding = ops.rotary_embedding.default

    def describe(self) -> str:
        return f"{self.name} (rms_norm, fused_add_rms_norm, silu_and_mul, rotary_embedding)"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float) -> torch.Tensor:
        return self._rms_norm(x, weight, eps, weight_offset)

    def fused_add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._fused_add_rms_norm(x, residual, weight, eps, weight_offset)

    def silu_and_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return self._silu_and_mul(gate, up)

    def rotary_embedding(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._rotary_embedding(positions, query, key, cos, sin)


def cpu_layer_ops() -> LayerOps:
    """The native ops, built (or found in the cache) now; core's PyTorch ops, with the reason, where
    the build is unavailable or fails."""
    reason = unavailable_reason(LIBRARY, SOURCES)
    if reason is not None:
        logger.warning("kvserve-platform-cpu: fused layer ops unavailable, using PyTorch's: %s", reason)
        return TorchLayerOps(reason=f"native layer ops unavailable: {reason.splitlines()[0]}")
    return NativeLayerOps()
