"""AutoAWQ's GEMM packing: eight 4-bit values per int32 along the output features, stored in the
interleaved order ``0, 2, 4, 6, 1, 3, 5, 7`` (nibble ``i`` holds feature ``ORDER[i]``)."""

from __future__ import annotations

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_REVERSE_ORDER = tuple(AWQ_ORDER.index(i) for i in range(8))  # feature j sits in nibble _REVERSE_ORDER[j]


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """int32 ``[rows, cols / 8]`` -> int32 ``[rows, cols]`` of values 0..15 in feature order."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    nibbles = (packed[:, :, None] >> shifts) & 0xF
    order = torch.tensor(_REVERSE_ORDER, device=packed.device)
    return nibbles[:, :, order].reshape(packed.shape[0], -1)


def dequantize(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """``W^T`` ``[in, out]`` in ``scales``' dtype: ``(q - zero) * scale`` per group of input rows."""
    weight = unpack(qweight)
    zeros = unpack(qzeros).repeat_interleave(group_size, dim=0)
    return (weight - zeros).to(scales.dtype) * scales.repeat_interleave(group_size, dim=0)
