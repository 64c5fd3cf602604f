"""Writing this step's K/V into a paged cache without a device sync (for backends whose K and V
caches are ``[blocks, block_size, kv_heads, d]`` tensors or views of one)."""

from __future__ import annotations

import torch


def store_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store token ``t``'s K/V at slot ``slot_mapping[t]`` of caches shaped ``[blocks, block_size, kv_heads, d]``
    (any strides; e.g. ``kv[0]``/``kv[1]`` of a ``(2, blocks, ...)`` cache, or ``kv[:, 0]``/``kv[:, 1]``
    of FlashInfer's NHD ``(blocks, 2, ...)``); tokens with slot -1 (padding) change nothing. K/V are
    cast to the cache dtype.

    Dropping the padded tokens would need their count on the host (a sync, and no CUDA graph);
    instead they are pointed at slot 0, of the null block no sequence owns, and write back what
    slot 0 already holds.
    """
    block_size = k_cache.shape[1]
    padded = (slot_mapping < 0)[:, None, None]
    slots = slot_mapping.clamp(min=0)
    blocks, offsets = slots // block_size, slots % block_size
    for cache, new in ((k_cache, key), (v_cache, value)):
        cache[blocks, offsets] = torch.where(padded, cache[blocks, offsets], new.to(cache.dtype))
