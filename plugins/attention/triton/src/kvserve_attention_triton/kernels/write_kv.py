"""Storing this step's K/V rows in the paged cache at their ``slot_mapping`` slots."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvserve_attention_triton.kernels.common import INTERPRETED, cache_strides


@triton.jit
def _write_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
    stride_ckb, stride_cks, stride_ckh, stride_ckd, stride_cvb, stride_cvs, stride_cvh, stride_cvd,
    num_tokens, block_size, num_kv_heads, head_dim,
    BLOCK_T: tl.constexpr, HEADS_PAD: tl.constexpr, HEAD_PAD: tl.constexpr,
):  # fmt: skip
    # a [BLOCK_T, HEADS_PAD, HEAD_PAD] tile: BLOCK_T tokens, all their KV heads
    token = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    token_valid = token < num_tokens
    raw_slot = tl.load(slot_mapping_ptr + token, mask=token_valid, other=-1).to(tl.int64)
    keep_token = raw_slot >= 0  # -1 marks a padded token: nothing is stored
    slot = tl.maximum(raw_slot, 0)
    block, offset = slot // block_size, slot % block_size
    t = token[:, None, None]
    h = tl.arange(0, HEADS_PAD)[None, :, None]
    d = tl.arange(0, HEAD_PAD)[None, None, :]
    mask = token_valid[:, None, None] & (h < num_kv_heads) & (d < head_dim)
    keep = mask & keep_token[:, None, None]
    k = tl.load(key_ptr + t * stride_kt + h * stride_kh + d * stride_kd, mask=mask)
    v = tl.load(value_ptr + t * stride_vt + h * stride_vh + d * stride_vd, mask=mask)
    b, o = block[:, None, None], offset[:, None, None]
    k_dst = k_cache_ptr + b * stride_ckb + o * stride_cks + h * stride_ckh + d * stride_ckd
    v_dst = v_cache_ptr + b * stride_cvb + o * stride_cvs + h * stride_cvh + d * stride_cvd
    tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=keep)
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=keep)


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
    heads_pad, head_pad = triton.next_power_of_2(num_kv_heads), triton.next_power_of_2(head_dim)
    # A GPU program holds ~4096 elements in registers; the interpreter pays per program, so takes more.
    budget = 1 << 16 if INTERPRETED else 4096
    block_t = max(1, min(64, triton.next_power_of_2(max(1, budget // (heads_pad * head_pad)))))
    block_t = min(block_t, triton.next_power_of_2(num_tokens))
    _write_kv_kernel[(triton.cdiv(num_tokens, block_t),)](
        key, value, key_cache, value_cache, slot_mapping, *key.stride(), *value.stride(),
        *cache_strides(key_cache), *cache_strides(value_cache), num_tokens, key_cache.shape[1], num_kv_heads,
        head_dim, BLOCK_T=block_t, HEADS_PAD=heads_pad, HEAD_PAD=head_pad,
    )  # fmt: skip
