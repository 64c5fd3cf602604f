"""The quantization contracts of both FP8 formats, shipped with the plugin so that
``kvserve plugins check`` can run them: plain references of the formats' published layouts."""

from __future__ import annotations

import torch

from kvserve.testing import QuantizationMethodContract

_FP8_MAX = 448.0


def _to_fp8(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (weight / scale).clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)


class Fp8Contract(QuantizationMethodContract):
    """vLLM-style ``fp8``: E4M3 weight, one float32 ``weight_scale`` per tensor (``amax / 448``)."""

    quantization = "fp8"
    quant_config = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    max_error = 0.05  # E4M3 keeps 3 mantissa bits
    fused_tolerance = 0.05  # on CUDA fused shards are requantized to the largest of their scales

    def quantize(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        scale = weight.abs().amax() / _FP8_MAX
        return {"weight": _to_fp8(weight, scale), "weight_scale": scale.reshape(()).float()}

    def dequantize(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        return tensors["weight"].float() * tensors["weight_scale"]


class CompressedTensorsFp8Contract(QuantizationMethodContract):
    """compressed-tensors ``float-quantized`` FP8 with per-channel ``weight_scale [out, 1]``
    (llmcompressor's ``FP8_DYNAMIC`` scheme)."""

    quantization = "compressed-tensors"
    quant_config = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"type": "float", "num_bits": 8, "strategy": "channel", "symmetric": True, "dynamic": False},
                "input_activations": {"type": "float", "num_bits": 8, "strategy": "token", "dynamic": True},
            }
        },
        "ignore": ["lm_head"],
    }
    max_error = 0.05

    def quantize(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        scale = weight.abs().amax(dim=1, keepdim=True) / _FP8_MAX
        return {"weight": _to_fp8(weight, scale), "weight_scale": scale.float()}

    def dequantize(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        return tensors["weight"].float() * tensors["weight_scale"]
