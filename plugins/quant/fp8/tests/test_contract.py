"""Both FP8 formats, and online FP8, pass the quantization contract."""

from typing import ClassVar

import torch

from kvserve_quant_fp8.contract import CompressedTensorsFp8Contract, Fp8Contract


class TestFp8Checkpoint(Fp8Contract):
    """vLLM-style per-tensor FP8 with dynamic activations."""


class TestFp8StaticInputScale(Fp8Contract):
    """vLLM-style per-tensor FP8 with a static ``input_scale`` per projection."""

    quant_config = {"quant_method": "fp8", "activation_scheme": "static"}

    def quantize(self, weight):
        return {**super().quantize(weight), "input_scale": torch.tensor(0.02)}


class TestCompressedTensorsPerChannel(CompressedTensorsFp8Contract):
    """compressed-tensors FP8 per channel (fused shards keep their own rows of scales)."""


class TestCompressedTensorsPerTensor(CompressedTensorsFp8Contract):
    """compressed-tensors FP8 per tensor with static input scales (llmcompressor's ``FP8``)."""

    quant_config = {
        **CompressedTensorsFp8Contract.quant_config,
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"type": "float", "num_bits": 8, "strategy": "tensor", "symmetric": True, "dynamic": False},
                "input_activations": {"type": "float", "num_bits": 8, "strategy": "tensor", "dynamic": False},
            }
        },
    }
    fused_tolerance = 0.05

    def quantize(self, weight):
        scale = weight.abs().amax() / 448.0
        fp8 = (weight / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
        return {"weight": fp8, "weight_scale": scale.reshape(1).float(), "input_scale": torch.tensor([0.02])}


class TestOnlineFp8(Fp8Contract):
    """``quantization="fp8"`` on a float checkpoint: the float weight is quantized at load, so the
    reference is the float weight itself and the tolerance is FP8's rounding."""

    quant_config = None
    reference_tolerance: ClassVar[dict[str, float]] = {"float32": 0.05, "bfloat16": 0.05, "float16": 0.05}
    fused_tolerance = 0.0

    def quantize(self, weight):
        return {"weight": weight}

    def dequantize(self, tensors):
        return tensors["weight"].float()
