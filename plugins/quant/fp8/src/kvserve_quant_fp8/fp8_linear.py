"""What every FP8 format shares once loaded: an E4M3 weight ``[out, in]`` with one float32
scale per tensor (``[]``) or per output channel (``[out, 1]``), ``W ≈ weight * weight_scale``.

CPU: where the platform's ``LinearKernel`` multiplies FP8 weights (``pack_quantized``; the CPU
platform's C++ kernel converts E4M3 to bfloat16 in registers), the layer keeps its weight in FP8,
in that kernel's layout, and computes through it (:func:`use_platform_kernel`). Elsewhere (no such
kernel, a dtype or shape it refuses) the weight is dequantized to the activation dtype inside the
layer, one layer at a time (``torch._scaled_mm`` on CPU runs a reference path far slower than a
dense matmul). Fused shards keep their own per-tensor scales as per-row scales, exactly. CUDA with
compute capability 8.9+ and a per-tensor scale: ``torch._scaled_mm`` on FP8 activations
quantized per tensor (dynamically, or with the checkpoint's static ``input_scale``).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from kvserve.interfaces import LinearKernel

logger = logging.getLogger(__name__)

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max  # 448
# Every E4M3 value by its byte: on CPU a gather from this table dequantizes ~15x faster than
# casting float8 (measured: 1.9 ms against 28 ms for a 2048x768 weight, one thread).
_FP8_VALUES = torch.arange(256, dtype=torch.uint8).view(FP8_DTYPE).to(torch.float32)


def quantize_per_tensor(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fp8 weight, float32 scale [])`` with ``scale = amax / 448``, as vLLM's dynamic FP8."""
    scale = (weight.abs().amax().float() / FP8_MAX).clamp(min=1e-12)
    return (weight.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def requantize_shards(weight: torch.Tensor, scales: torch.Tensor, output_sizes: list[int]) -> torch.Tensor:
    """One per-tensor scale for a fused layer whose shards were stored with their own, for a
    kernel that takes one: each shard is dequantized and requantized to the largest scale (as
    vLLM does; it costs one more FP8 rounding)."""
    largest = scales.max()
    parts = []
    for part, scale in zip(weight.split(output_sizes, dim=0), scales, strict=True):
        parts.append((part.float() * scale / largest).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE))
    return torch.cat(parts, dim=0)


def device_unavailable_reason(device: torch.device) -> str | None:
    """Why ``torch._scaled_mm`` cannot run on ``device`` (None: it can)."""
    if device.type != "cuda":
        return f"{device.type} runs no FP8 matmul kernel; weights are dequantized per layer"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return f"compute capability {major}.{minor} < 8.9 has no FP8 tensor cores; weights are dequantized per layer"
    return None


def scaled_mm_unavailable_reason(layer: torch.nn.Module) -> str | None:
    """Why ``torch._scaled_mm`` does not serve this loaded layer (None: it does)."""
    reason = device_unavailable_reason(layer.weight.device)
    if reason is None and layer.weight_scale.numel() != 1:
        return "per-channel weight scales are dequantized per layer (only per-tensor scales use torch._scaled_mm)"
    return reason


def finish_loading(layer: torch.nn.Module) -> None:
    """Choose the kernel of a loaded layer (``layer.use_scaled_mm``), logging why not when not."""
    reason = scaled_mm_unavailable_reason(layer)
    layer.use_scaled_mm = reason is None
    layer.fp8_kernel = None  # set by use_platform_kernel
    if reason is not None and layer.weight.device.type == "cuda":
        logger.info("FP8 layer %s: %s", layer.prefix, reason)


def use_platform_kernel(layer: torch.nn.Module, kernel: LinearKernel) -> bool:
    """Move a loaded layer (not one on ``torch._scaled_mm``) onto ``kernel`` where it multiplies
    this FP8 weight and scale in the model dtype: the weight is replaced by the kernel's packing of
    it (still FP8, the same bytes), so no wider copy is kept. Returns whether it was."""
    if layer.use_scaled_mm:
        return False
    packed = kernel.pack_quantized(layer.weight.data, layer.weight_scale.data, layer.params_dtype)
    if packed is None:
        return False
    layer.weight = torch.nn.Parameter(packed, requires_grad=False)
    layer.fp8_kernel = kernel
    return True


def apply_fp8(layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ (weight * weight_scale).T + bias`` in ``x``'s dtype."""
    if layer.fp8_kernel is not None:
        return layer.fp8_kernel.apply_quantized(x, layer.weight, layer.weight_scale, bias)
    if layer.use_scaled_mm:
        return _scaled_mm(layer, x, bias)
    return F.linear(x, dequantize(layer.weight, layer.weight_scale, x.dtype), bias)


def dequantize(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``weight * scale`` in ``dtype`` (computed in float32), through the table of E4M3 values."""
    codes = weight.view(torch.uint8).long()
    values = _FP8_VALUES.to(weight.device)
    if scale.numel() == 1:  # scale the 256 table entries, not the weight
        return torch.take((values * scale).to(dtype), codes)
    return (torch.take(values, codes) * scale).to(dtype)


def _scaled_mm(layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    input_scale = getattr(layer, "input_scale", None)
    if input_scale is None:
        x_scale = (rows.abs().amax().float() / FP8_MAX).clamp(min=1e-12)
    else:
        x_scale = input_scale.reshape(())
    x_fp8 = (rows.float() / x_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    out = torch._scaled_mm(
        x_fp8, layer.weight.t(), scale_a=x_scale, scale_b=layer.weight_scale.reshape(()), bias=bias, out_dtype=x.dtype
    )
    return out.reshape(*x.shape[:-1], out.shape[-1])
