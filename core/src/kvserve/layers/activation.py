"""Gated activations ``act(gate) * up``, the op between a gated MLP's gate/up and down projections."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvserve.layers.layer_ops import LayerOpsModule


class SiluAndMul(LayerOpsModule):
    """``silu(gate) * up`` (SwiGLU: Llama's MLP), one layer op a platform may fuse."""

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return self.ops.silu_and_mul(gate, up)


class GeluTanhAndMul(torch.nn.Module):
    """``gelu_tanh(gate) * up`` (GeGLU: Gemma's MLP), in plain PyTorch as HF computes it."""

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.gelu(gate, approximate="tanh") * up


GATED_ACTIVATIONS: dict[str, type[torch.nn.Module]] = {"silu": SiluAndMul, "gelu_tanh": GeluTanhAndMul}
"""A gated activation's name (``DecoderSpec.activation``) -> its layer."""


def gated_activation(name: str) -> torch.nn.Module:
    """The gated activation layer called ``name``; ValueError naming the known ones otherwise."""
    layer = GATED_ACTIVATIONS.get(name)
    if layer is None:
        raise ValueError(f"gated activation {name!r} is unknown (known: {sorted(GATED_ACTIVATIONS)})")
    return layer()
