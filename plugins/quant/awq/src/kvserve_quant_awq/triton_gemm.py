"""An AWQ GEMM in Triton for GPUs: ``x @ W^T`` straight from the packed AWQ tensors.

Each program computes one ``[BLOCK_M, BLOCK_N]`` output tile: for every ``BLOCK_K`` slice of
the input features it loads the packed int32 words of its columns (eight columns share one),
shifts each column's nibble out in AWQ's order, subtracts the group's zero, scales, and
accumulates a float32 dot. Nothing is dequantized outside the tile. Tested on CPU under
``TRITON_INTERPRET=1``; importing this module imports triton.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit
def _awq_gemm_kernel(
    x_ptr, qweight_ptr, qzeros_ptr, scales_ptr, out_ptr,
    M, N, K, group_size,
    stride_xm, stride_xk, stride_om, stride_on,
    DOT_FP32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Output feature j of a packed word sits in nibble (j // 2) + 4 * (j % 2): AWQ's order inverted.
    j = offs_n % 8
    shifts = ((j // 2) + (j % 2) * 4) * 4
    packed_cols = offs_n // 8
    n_mask = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
            mask=(offs_m[:, None] < M) & k_mask[None, :], other=0.0,
        )  # fmt: skip
        tile_mask = k_mask[:, None] & n_mask[None, :]
        words = tl.load(qweight_ptr + offs_k[:, None] * (N // 8) + packed_cols[None, :], mask=tile_mask, other=0)
        groups = offs_k // group_size
        zero_words = tl.load(qzeros_ptr + groups[:, None] * (N // 8) + packed_cols[None, :], mask=tile_mask, other=0)
        scales = tl.load(scales_ptr + groups[:, None] * N + offs_n[None, :], mask=tile_mask, other=0.0)
        q = (words >> shifts[None, :]) & 0xF
        z = (zero_words >> shifts[None, :]) & 0xF
        w = (q - z).to(tl.float32) * scales.to(tl.float32)
        if DOT_FP32:  # fp32 activations, or the interpreter (it computes 16-bit tl.dot wrongly)
            acc += tl.dot(x.to(tl.float32), w, input_precision="ieee")
        else:
            acc += tl.dot(x, w.to(x.dtype))
    out = acc.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on, out,
             mask=(offs_m[:, None] < M) & n_mask[None, :])  # fmt: skip


def awq_gemm(
    x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int
) -> torch.Tensor:
    """``x @ W^T`` for ``x`` ``[..., in]`` and AWQ GEMM tensors (contiguous), in ``x``'s dtype."""
    rows = x.reshape(-1, x.shape[-1])
    m, k = rows.shape
    n = scales.shape[1]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_m = 16 if m <= 16 else 32
    dot_fp32 = x.dtype == torch.float32 or os.environ.get("TRITON_INTERPRET") == "1"
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, 64))
    _awq_gemm_kernel[grid](
        rows, qweight, qzeros, scales, out, m, n, k, group_size,
        rows.stride(0), rows.stride(1), out.stride(0), out.stride(1),
        DOT_FP32=dot_fp32, BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=32,
    )  # fmt: skip
    return out.reshape(*x.shape[:-1], n)
