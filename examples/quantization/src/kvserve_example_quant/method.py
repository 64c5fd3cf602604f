"""Weight-only int8 quantization: each output row of ``W`` is stored as int8 with one float scale,
``W ≈ weight * weight_scale[:, None]``; activations stay in the model dtype."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvserve.interfaces import ParamLoading, QuantizationMethod


class Int8WeightOnlyMethod(QuantizationMethod):
    """Checkpoint tensors per linear layer: ``weight`` (int8 ``[out, in]``) and ``weight_scale``
    (float32 ``[out]``); the layer adds its ``bias`` (model dtype) itself."""

    name = "example_int8"

    def create_weights(self, layer, input_size, output_sizes, params_dtype, prefix) -> None:
        # Both tensors grow with the output features along dim 0, so fused shards stack there.
        out = sum(output_sizes)
        layer.add_param("weight", torch.empty(out, input_size, dtype=torch.int8), ParamLoading(output_dim=0))
        layer.add_param("weight_scale", torch.empty(out, dtype=torch.float32), ParamLoading(output_dim=0))

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        # Dequantize in float32, then compute in the activations' dtype.
        weight = (layer.weight.float() * layer.weight_scale[:, None]).to(x.dtype)
        return F.linear(x, weight, bias)
