"""Core's LayerOps in plain PyTorch (HF transformers' numerics), and how a model's layers get theirs."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from kvserve.interfaces.layer_ops import LayerOps


class TorchLayerOps(LayerOps):
    """The reference :class:`LayerOps`: each op as the few PyTorch ops HF's modules run.

    ``reason``: why a platform fell back to these (shown on the start-up line); None when they are
    simply the choice.
    """

    name: ClassVar[str] = "torch"

    def __init__(self, reason: str | None = None) -> None:
        self.reason = reason

    def describe(self) -> str:
        return self.name if self.reason is None else f"{self.name} ({self.reason})"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        if weight_offset:
            return (x * (weight_offset + weight.float())).to(dtype)
        return weight * x.to(dtype)

    def fused_add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual = residual + x
        return self.rms_norm(residual, weight, eps, weight_offset), residual

    def silu_and_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up

    def rotary_embedding(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos = cos[positions].unsqueeze(1)
        sin = sin[positions].unsqueeze(1)
        return _rotate(query, cos, sin), _rotate(key, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)


TORCH_LAYER_OPS = TorchLayerOps()
"""What every layer computes with until :func:`use_layer_ops` gives it a platform's."""


class EagerAndGraphLayerOps(LayerOps):
    """``eager``'s ops in steps that run eagerly, core's PyTorch ops inside compiled graphs.

    At a compiled level, inductor fuses the PyTorch ops with their neighbours, which it cannot do
    with a platform's opaque kernels (nor trace them: they have no fake-tensor kernels); the steps
    it does not compile (larger than any decode step) run the platform's fused kernels as level 0
    does.
    """

    name: ClassVar[str] = "eager-and-graph"

    def __init__(self, eager: LayerOps) -> None:
        self.eager = eager

    def describe(self) -> str:
        return f"{self.eager.describe()} in eager steps, torch in compiled graphs (inductor fuses them)"

    def _ops(self) -> LayerOps:
        return TORCH_LAYER_OPS if torch.compiler.is_compiling() else self.eager

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float) -> torch.Tensor:
        return self._ops().rms_norm(x, weight, eps, weight_offset)

    def fused_add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._ops().fused_add_rms_norm(x, residual, weight, eps, weight_offset)

    def silu_and_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return self._ops().silu_and_mul(gate, up)

    def rotary_embedding(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._ops().rotary_embedding(positions, query, key, cos, sin)


class LayerOpsModule(torch.nn.Module):
    """A core layer whose compute is a :class:`LayerOps` call (``self.ops``), chosen once per engine."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: LayerOps = TORCH_LAYER_OPS


def use_layer_ops(model: torch.nn.Module, ops: LayerOps) -> int:
    """Point every :class:`LayerOpsModule` in ``model`` at ``ops``, before any forward; returns how many."""
    modules = [m for m in model.modules() if isinstance(m, LayerOpsModule)]
    for module in modules:
        module.ops = ops
    return len(modules)
