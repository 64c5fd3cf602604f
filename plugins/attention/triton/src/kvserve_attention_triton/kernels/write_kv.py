"""Storing this step's K/V rows in the paged cache at their ``slot_mapping`` slots."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvserve_attention_triton.kernels.common import cache_strides


@triton.jit
def _write_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
    stride_ckb, stride_cks, stride_ckh, stride_ckd, stride_cvb, stride_cvs, stride_cvh, stride_cvd,
    block_size, num_kv_heads, head_dim,
    HEADS_PAD: tl.constexpr, HEAD_PAD: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    raw_slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    slot = tl.maximum(raw_slot, 0)
    block, offset = slot // block_size, slot % block_size
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, HEAD_PAD)
    mask = (offs_h < num_kv_heads)[:, None] & (offs_d < head_dim)[None, :]
    keep = mask & (tl.zeros([HEADS_PAD, HEAD_PAD], dtype=tl.int64) + raw_slot >= 0)  # -1: a padded token
    k = tl.load(key_ptr + token * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :] * stride_kd, mask=mask)
    v = tl.load(value_ptr + token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :] * stride_vd, mask=mask)
    k_dst = k_cache_ptr + block * stride_ckb + offset * stride_cks + offs_h[:, None] * stride_ckh
    v_dst = v_cache_ptr + block * stride_cvb + offset * stride_cvs + offs_h[:, None] * stride_cvh
    tl.store(k_dst + offs_d[None, :] * stride_ckd, k.to(k_cache_ptr.dtype.element_ty), mask=keep)
    tl.store(v_dst + offs_d[None, :] * stride_cvd, v.to(v_cache_ptr.dtype.element_ty), mask=keep)


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store ``key``/``value`` ``[num_tokens, num_kv_heads, head_dim]`` (any strides) in the caches
    ``[num_blocks, block_size, num_kv_heads, head_dim]`` at ``slot_mapping`` (int ``[num_tokens]``,
    ``block * block_size + offset``); tokens whose slot is -1 are skipped."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping, *key.stride(), *value.stride(),
        *cache_strides(key_cache), *cache_strides(value_cache), key_cache.shape[1], num_kv_heads, head_dim,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads), HEAD_PAD=triton.next_power_of_2(head_dim),
    )  # fmt: skip
