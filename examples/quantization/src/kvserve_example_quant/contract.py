"""The quantization contract for this format, shipped with the plugin so that
``kvserve plugins check`` can run it (the registration names it with ``contract=...``)."""

from __future__ import annotations

import torch

from kvserve.testing import QuantizationMethodContract


class Int8Contract(QuantizationMethodContract):
    """A plain reference of the format: symmetric int8 per output row, scale = row max / 127."""

    quantization = "example_int8"
    max_error = 0.02  # rounding to 255 levels per row

    def quantize(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        scale = weight.abs().amax(dim=1).clamp(min=1e-8) / 127
        quantized = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
        return {"weight": quantized, "weight_scale": scale.float()}

    def dequantize(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        return tensors["weight"].float() * tensors["weight_scale"][:, None]
