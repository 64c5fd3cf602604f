"""``quant_method: "fp8"``: vLLM-style FP8 checkpoints, and online dynamic FP8.

A checkpoint (``quantization_config = {"quant_method": "fp8", "activation_scheme": "static" |
"dynamic", "ignored_layers": [...]}``) holds per linear layer ``weight`` (float8_e4m3fn
``[out, in]``), ``weight_scale`` (float32, one per tensor) and, for static activations,
``input_scale`` (float32, one per tensor). Shards of a fused layer with different weight
scales are requantized to the largest at load where the FP8 kernel needs one scale (as vLLM
does); the dequantizing CPU path keeps each shard's scale as per-row scales instead.

Without a ``quantization_config`` (``quantization="fp8"`` on a bf16/fp32 checkpoint) the
float weight is loaded and quantized per tensor at load (online dynamic FP8).

Tensor parallelism: a rank loads its slice of each FP8 weight (rows in column layers, input
columns in row layers) and the checkpoint's per-tensor scales whole, so its dequantized slice is
exactly that of one device. Online FP8 quantizes each rank's slice with that slice's own scale
(as vLLM does), so its tokens may differ slightly from one device's.
"""

from __future__ import annotations

import torch

from kvserve.errors import ConfigError
from kvserve.interfaces import ParamLoading, QuantizationMethod
from kvserve_quant_fp8.fp8_linear import (
    FP8_DTYPE,
    apply_fp8,
    device_unavailable_reason,
    finish_loading,
    quantize_per_tensor,
    requantize_shards,
    use_platform_kernel,
)


class Fp8Method(QuantizationMethod):
    """FP8 E4M3 weights with per-tensor scales; activations stay in the model dtype on CPU."""

    name = "fp8"

    def __init__(self, quant_config=None) -> None:
        super().__init__(quant_config)
        config = self.quant_config
        self.online = not config
        if config.get("weight_block_size") is not None:
            raise ConfigError(
                f"quantization_config.weight_block_size: block-wise FP8 ({config['weight_block_size']}) is not "
                "supported by kvserve-quant-fp8 (per-tensor scales only)"
            )
        scheme = config.get("activation_scheme", "dynamic")
        if scheme not in ("static", "dynamic"):
            raise ConfigError(f"quantization_config.activation_scheme: {scheme!r} is not 'static' or 'dynamic'")
        self.static_inputs = scheme == "static"

    def ignored_prefixes(self) -> list[str]:
        return list(self.quant_config.get("ignored_layers") or [])

    def create_weights(self, layer, input_size, output_sizes, params_dtype, prefix) -> None:
        out = sum(output_sizes)
        if self.online:  # the float checkpoint weight; quantized in process_weights_after_loading
            layer.add_param("weight", torch.empty(out, input_size, dtype=params_dtype), ParamLoading(input_dim=1))
            return
        shards = len(output_sizes)
        layer.add_param("weight", torch.empty(out, input_size, dtype=FP8_DTYPE), ParamLoading(input_dim=1))
        # One scale per tensor: a row-parallel rank's slice of the weight keeps its tensor's scale.
        per_shard = ParamLoading(output_dim=None, per_shard=True, input_replicated=True)
        layer.add_param("weight_scale", torch.ones(shards, dtype=torch.float32), per_shard)
        if self.static_inputs:
            layer.add_param("input_scale", torch.ones(shards, dtype=torch.float32), per_shard)

    def process_weights_after_loading(self, layer) -> None:
        if self.online:
            weight, scale = quantize_per_tensor(layer.weight.data)
        else:
            weight, scale = self._fuse_shard_scales(layer)
            if self.static_inputs:  # one activation scale covers every shard's input range
                layer.input_scale = torch.nn.Parameter(layer.input_scale.data.max(), requires_grad=False)
        layer.weight = torch.nn.Parameter(weight, requires_grad=False)
        layer.weight_scale = torch.nn.Parameter(scale, requires_grad=False)
        finish_loading(layer)

    @staticmethod
    def _fuse_shard_scales(layer) -> tuple[torch.Tensor, torch.Tensor]:
        """The weight and its scale for a layer loaded with one per-tensor scale per shard: one
        scale (``[]``) when all agree or the FP8 kernel needs one (requantizing), else per-row
        scales ``[out, 1]`` (exact, for the dequantizing path)."""
        scales, weight = layer.weight_scale.data, layer.weight.data
        if bool(torch.all(scales == scales[0])):
            return weight, scales[0].clone()
        if device_unavailable_reason(weight.device) is None:
            return requantize_shards(weight, scales, layer.output_sizes), scales.max()
        sizes = torch.tensor(layer.output_sizes, device=scales.device)
        return weight, scales.repeat_interleave(sizes)[:, None].contiguous()

    def use_linear_kernel(self, layer, kernel) -> bool:
        return use_platform_kernel(layer, kernel)

    def apply(self, layer, x, bias):
        return apply_fp8(layer, x, bias)
