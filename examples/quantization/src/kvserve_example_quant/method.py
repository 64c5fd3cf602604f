"""Weight-only int8 quantization: each output row of ``W`` is stored as int8 with one float scale,
``W ≈ weight * weight_scale[:, None]``; activations stay in the model dtype."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvserve.interfaces import QuantizationMethod


class Int8WeightOnlyMethod(QuantizationMethod):
    """Checkpoint tensors per linear layer: ``weight`` (int8 ``[out, in]``), ``weight_scale``
    (float32 ``[out]``) and, if the layer has one, ``bias`` (model dtype)."""

    name = "example_int8"

    def create_weights(self, layer: torch.nn.Module, in_features: int, out_features: int, bias: bool) -> None:
        def frozen(tensor: torch.Tensor) -> torch.nn.Parameter:
            return torch.nn.Parameter(tensor, requires_grad=False)

        layer.weight = frozen(torch.empty(out_features, in_features, dtype=torch.int8))
        layer.weight_scale = frozen(torch.empty(out_features, dtype=torch.float32))
        layer.bias = frozen(torch.zeros(out_features)) if bias else None

    def apply(self, layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        # Dequantize in float32, then compute in the activations' dtype.
        weight = (layer.weight.float() * layer.weight_scale[:, None]).to(x.dtype)
        return F.linear(x, weight, layer.bias)
