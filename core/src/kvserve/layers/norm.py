"""RMSNorm, computed in float32 like HF transformers, with the residual add fused in."""

from __future__ import annotations

import torch

from kvserve.layers.layer_ops import LayerOpsModule


class RMSNorm(LayerOpsModule):
    """``x / rms(x) * gain`` over the last dimension.

    ``weight_offset=0`` (Llama): the gain is ``weight``, applied after casting back to the input
    dtype. ``weight_offset=1`` (Gemma): the checkpoint stores ``gain - 1``; the gain
    ``1 + weight`` is applied in float32 before the cast, as HF's Gemma RMSNorm does.

    ``norm(x)`` returns the normalized ``x``; ``norm(x, residual)`` adds ``x`` to the residual
    stream first and returns ``(norm(residual + x), residual + x)`` (vLLM's fused residual: a
    decoder layer's add and the next norm are one op where the platform has it);
    :meth:`add_and_norm` is the latter where the stream may not have started yet.
    """

    def __init__(self, hidden_size: int, eps: float, weight_offset: float = 0.0) -> None:
        super().__init__()
        # Initialised to a unit gain either way.
        self.weight = torch.nn.Parameter(torch.full((hidden_size,), 1.0 - weight_offset), requires_grad=False)
        self.eps = eps
        self.weight_offset = weight_offset

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return self.ops.rms_norm(x, self.weight, self.eps, self.weight_offset)
        return self.ops.fused_add_rms_norm(x, residual, self.weight, self.eps, self.weight_offset)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``norm(x, residual)``; with ``residual`` None (a decoder's first layer, ``x`` the embedding,
        where the stream starts) ``(norm(x), x)``."""
        if residual is None:
            return self(x), x
        return self(x, residual)
