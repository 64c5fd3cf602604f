"""PyTorch's int4 CPU matmul (``_weight_int4pack_mm_for_cpu``), fed from AWQ tensors once at load.

Its weight is ``[out, in/2]`` uint8 (two 4-bit values a byte) and its per-group table
``[in/group, out, 2]`` holds ``(scale, zero)`` in the activation dtype with the dequantization
``w = (q - 8) * scale + zero``; AWQ's ``w = (q - z) * s`` is that with ``zero = (8 - z) * s``.
Measured on SmolLM2-135M shapes (576x1536, 1536x576, 576x960, group 64, one thread) in bf16:
17-80 us at 1-8 rows and 190-310 us at 32, against 1.6-5.8 ms to dequantize the packed weight
and matmul (``benchmarks/awq_cpu_kernels.py``); in fp16/fp32 it is slower than that from 8 rows.
"""

from __future__ import annotations

import torch

from kvserve_quant_awq.packing import unpack


def repack(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """AWQ ``qweight [in, out/8]``, ``qzeros [in/g, out/8]``, ``scales [in/g, out]`` -> the int4
    CPU weight and its ``(scale, zero)`` table in ``dtype``."""
    weight = unpack(qweight).t().contiguous()  # [out, in], values 0..15
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(weight, 1)
    scale = scales.float()
    zero = (8 - unpack(qzeros).float()) * scale
    return packed, torch.stack([scale, zero], dim=-1).to(dtype).contiguous()


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, table: torch.Tensor, group_size: int) -> torch.Tensor:
    """``x @ W^T`` for ``x`` ``[..., in]`` in the table's dtype."""
    rows = x.reshape(-1, x.shape[-1])
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, packed, group_size, table)
    return out.reshape(*x.shape[:-1], out.shape[-1])
