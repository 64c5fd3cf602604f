"""The AWQ quantization contract, shipped with the plugin so that ``kvserve plugins check`` can
run it: a plain packer written from AutoAWQ's published GEMM layout (the plugin's tests check it
bit for bit against AutoAWQ's own ``WQLinear_GEMM.from_linear``)."""

from __future__ import annotations

from typing import ClassVar

import torch

from kvserve.testing import QuantizationMethodContract

ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of each int32 holds output feature 8c + ORDER[i]


def awq_scales_and_zeros(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """AutoAWQ's asymmetric 4-bit grid per group of input features: ``[in/g, out]`` scales and
    integer zeros (``scale = (max - min) / 15``, ``zero = -round(min / scale)``)."""
    out, inp = weight.shape
    groups = weight.reshape(out, inp // group_size, group_size)
    high, low = groups.amax(dim=-1), groups.amin(dim=-1)
    scales = (high - low).clamp(min=1e-5) / 15
    zeros = (-torch.round(low / scales)).clamp(0, 15)
    return scales.t().contiguous(), zeros.t().contiguous()


def pack_columns(values: torch.Tensor) -> torch.Tensor:
    """int ``[rows, cols]`` of 0..15 -> int32 ``[rows, cols / 8]`` in AWQ's nibble order."""
    rows, cols = values.shape
    packed = torch.zeros(rows, cols // 8, dtype=torch.int64)
    for nibble, feature in enumerate(ORDER):
        packed |= values[:, feature::8].to(torch.int64) << (4 * nibble)
    return packed.to(torch.int32)  # two's complement wrap, as AutoAWQ's int32 shifts give


def unpack_columns(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_columns`."""
    rows, cols8 = packed.shape
    values = torch.empty(rows, cols8 * 8, dtype=torch.int64)
    for nibble, feature in enumerate(ORDER):
        values[:, feature::8] = (packed.to(torch.int64) >> (4 * nibble)) & 0xF
    return values


class AwqContract(QuantizationMethodContract):
    """AutoAWQ GEMM, 4 bits, zero point, ``group_size`` 128 (subclasses change it)."""

    quantization = "awq"
    quant_config: ClassVar[dict] = {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": 128}
    shapes = ((256, 64), (384, 96))
    max_error = 0.12  # 16 levels per group
    reference_tolerance: ClassVar[dict[str, float]] = {"float32": 1e-5, "bfloat16": 1e-2, "float16": 2e-3}

    def quantize(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        group_size = self.quant_config["group_size"]
        scales, zeros = awq_scales_and_zeros(weight, group_size)
        # As AutoAWQ rounds: q = round((w + zero * scale) / float16(scale)).
        offset = (zeros * scales).repeat_interleave(group_size, 0)
        stored = scales.half()
        q = torch.round((weight.t() + offset) / stored.float().repeat_interleave(group_size, 0)).clamp(0, 15)
        return {"qweight": pack_columns(q), "qzeros": pack_columns(zeros), "scales": stored}

    def dequantize(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        group_size = self.quant_config["group_size"]
        q = unpack_columns(tensors["qweight"]).double()
        zeros = unpack_columns(tensors["qzeros"]).double().repeat_interleave(group_size, 0)
        scales = tensors["scales"].double().repeat_interleave(group_size, 0)
        return ((q - zeros) * scales).t().float()
