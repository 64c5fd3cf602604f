"""GGML block formats: their sizes and a vectorised torch dequantization of each.

Every function takes ``blocks``, uint8 ``[n, type_size]`` (one block a row, as the file stores
them), and returns float32 ``[n, block_size]``. The arithmetic follows gguf-py's numpy
dequantization operation for operation, so float32 results are bit-identical to it (and to the
weights ``quantization="none"`` loads).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

QK_K = 256
"""Weights per super-block of the K-quants."""


@dataclass(frozen=True)
class BlockFormat:
    """One GGML type: ``block_size`` weights in ``type_size`` bytes."""

    name: str
    block_size: int
    type_size: int
    dequantize_blocks: Callable[[torch.Tensor], torch.Tensor]

    def row_bytes(self, in_features: int) -> int:
        """Bytes of one output feature's row of ``in_features`` weights."""
        return in_features // self.block_size * self.type_size

    def dequantize(self, data: torch.Tensor, in_features: int, dtype: torch.dtype) -> torch.Tensor:
        """The ``[rows, in_features]`` weight in ``dtype`` that the flat uint8 ``data`` holds."""
        blocks = data.view(-1, self.type_size)
        return self.dequantize_blocks(blocks).to(dtype).view(-1, in_features)


def _half(data: torch.Tensor) -> torch.Tensor:
    """float16 fields (two bytes per row) as float32 ``[n, 1]``."""
    return data.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor, groups: int) -> torch.Tensor:
    """``qs [n, groups * m]`` as ``[n, groups, 2, m]``: the low nibbles of each group of ``m``
    bytes, then its high nibbles (GGML's element order)."""
    qs = qs.view(qs.shape[0], groups, 1, -1)
    return torch.cat([qs & 0x0F, qs >> 4], dim=2)


def _bits(data: torch.Tensor, shifts: int, width: int = 1) -> torch.Tensor:
    """``data [..., m]`` as ``[..., shifts, m]``: field ``i`` is ``(data >> (width * i)) & mask``."""
    shift = torch.arange(0, shifts * width, width, dtype=torch.uint8, device=data.device).view(-1, 1)
    return (data.unsqueeze(-2) >> shift) & ((1 << width) - 1)


def _q4_0(blocks: torch.Tensor) -> torch.Tensor:
    d = _half(blocks[:, :2])
    q = _nibbles(blocks[:, 2:], 1).reshape(blocks.shape[0], -1).to(torch.int8) - 8
    return d * q.float()


def _q4_1(blocks: torch.Tensor) -> torch.Tensor:
    d, m = _half(blocks[:, :2]), _half(blocks[:, 2:4])
    q = _nibbles(blocks[:, 4:], 1).reshape(blocks.shape[0], -1).float()
    return (d * q) + m


def _q5(qh_bytes: torch.Tensor, qs: torch.Tensor) -> torch.Tensor:
    """The 5-bit values of a Q5_0/Q5_1 block: bit ``j`` of the little-endian ``qh`` is element ``j``'s fifth."""
    n = qs.shape[0]
    qh = _bits(qh_bytes, 8).transpose(1, 2).reshape(n, 32)
    return _nibbles(qs, 1).reshape(n, -1) | (qh << 4)


def _q5_0(blocks: torch.Tensor) -> torch.Tensor:
    d = _half(blocks[:, :2])
    q = _q5(blocks[:, 2:6], blocks[:, 6:]).to(torch.int8) - 16
    return d * q.float()


def _q5_1(blocks: torch.Tensor) -> torch.Tensor:
    d, m = _half(blocks[:, :2]), _half(blocks[:, 2:4])
    q = _q5(blocks[:, 4:8], blocks[:, 8:]).float()
    return (d * q) + m


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    d = _half(blocks[:, :2])
    x = blocks[:, 2:].contiguous().view(torch.int8).float()
    return x * d


def _scale_min_k4(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight 6-bit scales and mins packed in a K-quant's 12 scale bytes."""
    d, m, m_d = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _k_scales(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: per sub-block scale ``d * sc`` and offset ``dmin * m``, ``[n, 8, 1]`` each."""
    n = blocks.shape[0]
    d, dmin = _half(blocks[:, :2]), _half(blocks[:, 2:4])
    sc, mn = _scale_min_k4(blocks[:, 4:16])
    return (d * sc.float()).view(n, -1, 1), (dmin * mn.float()).view(n, -1, 1)


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d, dm = _k_scales(blocks)
    q = _nibbles(blocks[:, 16:], 4).reshape(n, -1, 32).float()
    return (d * q - dm).reshape(n, QK_K)


def _q5_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d, dm = _k_scales(blocks)
    qh = _bits(blocks[:, 16:48], 8)
    ql = _nibbles(blocks[:, 48:], 4).reshape(n, -1, 32)
    q = (ql | (qh << 4)).float()
    return (d * q - dm).reshape(n, QK_K)


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    scales = blocks[:, 192:208].contiguous().view(torch.int8).float()
    d = (_half(blocks[:, 208:210]) * scales).view(n, QK_K // 16, 1)
    ql = _nibbles(blocks[:, :128], 2).reshape(n, -1, 32)
    qh = _bits(blocks[:, 128:192].reshape(n, 2, 32), 4, width=2).reshape(n, -1, 32)
    q = (ql | (qh << 4)).to(torch.int8) - 32
    return (d * q.view(n, QK_K // 16, -1).float()).reshape(n, QK_K)


def _float(dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    def dequantize(blocks: torch.Tensor) -> torch.Tensor:
        return blocks.contiguous().view(dtype).float()

    return dequantize


FORMATS: dict[str, BlockFormat] = {
    f.name: f
    for f in [
        BlockFormat("F32", 1, 4, _float(torch.float32)),
        BlockFormat("F16", 1, 2, _float(torch.float16)),
        BlockFormat("BF16", 1, 2, _float(torch.bfloat16)),
        BlockFormat("Q4_0", 32, 18, _q4_0),
        BlockFormat("Q4_1", 32, 20, _q4_1),
        BlockFormat("Q5_0", 32, 22, _q5_0),
        BlockFormat("Q5_1", 32, 24, _q5_1),
        BlockFormat("Q8_0", 32, 34, _q8_0),
        BlockFormat("Q4_K", QK_K, 144, _q4_k),
        BlockFormat("Q5_K", QK_K, 176, _q5_k),
        BlockFormat("Q6_K", QK_K, 210, _q6_k),
    ]
}
"""The GGML types this plugin runs, by gguf's type name."""
