"""A linear layer whose weight format is owned by a QuantizationMethod."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvserve.interfaces.quantization import QuantizationMethod


class UnquantizedLinearMethod(QuantizationMethod):
    """Plain dense weights in the model dtype (the method used when nothing is quantized)."""

    name = "none"

    def create_weights(self, layer: torch.nn.Module, in_features: int, out_features: int, bias: bool) -> None:
        layer.weight = torch.nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        layer.bias = torch.nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None

    def apply(self, layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, layer.weight, layer.bias)


class QuantLinear(torch.nn.Module):
    """``y = x W^T + b`` with parameters created and applied by ``quant_method``."""

    def __init__(self, in_features: int, out_features: int, bias: bool, quant_method: QuantizationMethod) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.quant_method = quant_method
        quant_method.create_weights(self, in_features, out_features, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x)
