"""The SwiGLU activation ``silu(gate) * up`` as one layer op."""

from __future__ import annotations

import torch

from kvserve.layers.layer_ops import LayerOpsModule


class SiluAndMul(LayerOpsModule):
    """``silu(gate) * up`` (Llama's MLP between its gate/up and down projections)."""

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return self.ops.silu_and_mul(gate, up)
