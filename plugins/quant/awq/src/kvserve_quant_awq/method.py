"""``quant_method: "awq"`` with ``version: "gemm"``: AutoAWQ's 4-bit checkpoints with zero points.

Per linear layer the checkpoint holds ``qweight`` (int32 ``[in, out/8]``, eight 4-bit values
per int32 in AWQ's order), ``qzeros`` (int32 ``[in/group, out/8]``, packed the same way) and
``scales`` (float16 ``[in/group, out]``); ``W^T = (q - zero) * scale`` per group of input rows.
``modules_to_not_convert`` names modules (by substring, as AutoAWQ matches) left dense.

Weights stay packed (about 4.3 bits a weight). On CPU with a bf16 model they are repacked once
at load into PyTorch's int4 CPU matmul; with fp16/fp32 the packed weight is dequantized per
matmul (there that int4 kernel is a fallback slower from 8 rows on: SmolLM2-135M shapes, one
thread, 32 rows, 25-40 ms against 2-24 ms; ``benchmarks/awq_cpu_kernels.py``). On CUDA the
Triton AWQ GEMM (``triton_gemm.py``, extra ``[triton]``) reads the packed tensors directly;
without triton it dequantizes per matmul too.

Tensor parallelism: a column layer takes its packed output columns, a row layer its input rows
of ``qweight`` and the matching groups of ``qzeros`` / ``scales``; a rank's share of a row
layer's input features must be whole groups, else the engine refuses to start, naming the layer.
"""

from __future__ import annotations

import importlib.util

import torch

from kvserve.errors import ConfigError
from kvserve.interfaces import ParamLoading, QuantizationMethod
from kvserve_quant_awq.int4pack import int4_matmul, repack
from kvserve_quant_awq.packing import dequantize

GROUP_SIZES = (32, 64, 128)
PACK = 8  # 4-bit values per int32
INT4PACK_DTYPES = (torch.bfloat16,)
"""Activation dtypes served by PyTorch's int4 CPU matmul: the only one where it is faster than
dequantizing (fp16 and fp32 run a fallback that is slower from 8 rows on)."""


def _field(config: dict, *names: str):
    for name in names:
        if name in config:
            return name, config[name]
    return names[0], None


class AwqMethod(QuantizationMethod):
    """AWQ GEMM 4-bit weights, zero point, group size 32/64/128."""

    name = "awq"

    def __init__(self, quant_config=None) -> None:
        super().__init__(quant_config)
        config = self.quant_config
        version = str(config.get("version", "gemm")).lower()
        if version != "gemm":
            raise ConfigError(
                f"quantization_config.version: {config['version']!r} is not supported by kvserve-quant-awq "
                "(supported: 'gemm')"
            )
        field, bits = _field(config, "bits", "w_bit")
        if bits != 4:
            raise ConfigError(f"quantization_config.{field}: {bits!r} is not supported by kvserve-quant-awq (only 4)")
        field, group = _field(config, "group_size", "q_group_size")
        if group not in GROUP_SIZES:
            raise ConfigError(
                f"quantization_config.{field}: {group!r} is not supported by kvserve-quant-awq "
                f"(supported: {', '.join(map(str, GROUP_SIZES))})"
            )
        if config.get("zero_point", True) is not True:
            raise ConfigError("quantization_config.zero_point: only AWQ with zero points is supported")
        self.group_size = group

    def is_ignored(self, prefix: str) -> bool:
        return any(module in prefix for module in self.quant_config.get("modules_to_not_convert") or [])

    def create_weights(self, layer, input_size, output_sizes, params_dtype, prefix) -> None:
        # Under tensor parallelism ``input_size`` is a row-parallel rank's slice: it must hold whole
        # groups, since each group's zeros and scales live on one rank.
        if input_size % self.group_size:
            split = getattr(layer, "input_slice", None) is not None
            where = "this tensor-parallel rank's share of " if split else ""
            raise ConfigError(
                f"quantization_config.group_size: {self.group_size} does not divide {where}the {input_size} "
                f"input features of {prefix}"
                + ("; choose a tensor_parallel_size that keeps whole groups on each rank" if split else "")
            )
        if any(size % PACK for size in output_sizes):
            raise ConfigError(f"{prefix}: output features {output_sizes} are not multiples of {PACK} (AWQ packing)")
        out, groups = sum(output_sizes), input_size // self.group_size
        # qweight runs along the input rows; qzeros and scales hold one row per group of them.
        qweight = ParamLoading(output_dim=1, packed_factor=PACK, input_dim=0)
        qzeros = ParamLoading(output_dim=1, packed_factor=PACK, input_dim=0, input_group=self.group_size)
        scales = ParamLoading(output_dim=1, input_dim=0, input_group=self.group_size)
        layer.add_param("qweight", torch.empty(input_size, out // PACK, dtype=torch.int32), qweight)
        layer.add_param("qzeros", torch.empty(groups, out // PACK, dtype=torch.int32), qzeros)
        layer.add_param("scales", torch.empty(groups, out, dtype=torch.float16), scales)

    def process_weights_after_loading(self, layer) -> None:
        dtype, device = layer.params_dtype, layer.qweight.device
        layer.use_int4pack = device.type == "cpu" and dtype in INT4PACK_DTYPES
        layer.use_triton = device.type == "cuda" and importlib.util.find_spec("triton") is not None
        if not layer.use_int4pack:
            return
        packed, table = repack(layer.qweight.data, layer.qzeros.data, layer.scales.data, dtype)
        del layer.qweight, layer.qzeros, layer.scales  # the int4 CPU form replaces them
        layer.int4_weight = torch.nn.Parameter(packed, requires_grad=False)
        layer.scales_and_zeros = torch.nn.Parameter(table, requires_grad=False)

    def apply(self, layer, x, bias):
        if layer.use_int4pack:
            table = layer.scales_and_zeros
            out = int4_matmul(x.to(table.dtype), layer.int4_weight, table, self.group_size).to(x.dtype)
        elif layer.use_triton:
            from kvserve_quant_awq.triton_gemm import awq_gemm

            out = awq_gemm(x, layer.qweight, layer.qzeros, layer.scales, self.group_size)
        else:
            weight = dequantize(layer.qweight, layer.qzeros, layer.scales.to(x.dtype), self.group_size)
            out = x @ weight
        return out + bias if bias is not None else out
