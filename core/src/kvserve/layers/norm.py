"""RMSNorm, computed in float32 like HF transformers."""

from __future__ import annotations

import torch


class RMSNorm(torch.nn.Module):
    """``x / rms(x) * gain`` over the last dimension.

    ``weight_offset=0`` (Llama): the gain is ``weight``, applied after casting back to the input
    dtype. ``weight_offset=1`` (Gemma): the checkpoint stores ``gain - 1``; the gain
    ``1 + weight`` is applied in float32 before the cast, as HF's Gemma RMSNorm does.
    """

    def __init__(self, hidden_size: int, eps: float, weight_offset: float = 0.0) -> None:
        super().__init__()
        # Initialised to a unit gain either way.
        self.weight = torch.nn.Parameter(torch.full((hidden_size,), 1.0 - weight_offset), requires_grad=False)
        self.eps = eps
        self.weight_offset = weight_offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight_offset:
            return (x * (self.weight_offset + self.weight.float())).to(dtype)
        return self.weight * x.to(dtype)
