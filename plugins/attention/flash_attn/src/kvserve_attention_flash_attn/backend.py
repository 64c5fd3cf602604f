"""FlashAttention 2 over a paged KV cache: ``flash_attn_varlen_func`` with a block table for steps
with prefills, ``flash_attn_with_kvcache`` for decode-only steps."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

import torch

from kvserve.interfaces import AttentionBackend
from kvserve.layers.kv_store import store_kv
from kvserve_attention_flash_attn import metadata as planning
from kvserve_attention_flash_attn.library import FLASH_ATTN

if TYPE_CHECKING:
    from kvserve.interfaces import AttentionBatch, AttentionSpec
    from kvserve_attention_flash_attn.metadata import FlashAttnMetadata


class FlashAttnBackend(AttentionBackend):
    """KV layout ``(2, num_blocks, block_size, num_kv_heads, head_dim)``: K then V, each the paged
    ``(num_blocks, page_block_size, nheads_k, headdim)`` cache flash-attn reads through ``block_table``.

    flash-attn requires ``page_block_size % 256 == 0``, fp16/bf16, head sizes that are multiples
    of 8 up to 256, and an Ampere or newer GPU; causal masks align to the bottom right, which is
    where a chunk's queries sit in its sequence.
    """

    name = "flash_attn"
    device_types = ("cuda",)
    supported_dtypes = ("float16", "bfloat16")
    supported_head_sizes = tuple(range(8, 257, 8))
    block_size_multiple = 256
    default_block_size = 256
    kv_cache_in_model_dtype = True
    required_library = FLASH_ATTN

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        self._layer_args = [
            (layer.scale, planning.window_size(layer.sliding_window), layer.logits_soft_cap or 0.0)
            for layer in spec.layers
        ]

    @classmethod
    def required_capability(cls, spec: AttentionSpec) -> tuple[int, int]:
        """FlashAttention 2 runs on Ampere (8.0) or newer."""
        return (8, 0)

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        """``(2, num_blocks, block_size, num_kv_heads, head_dim)``."""
        spec = self.spec
        return (2, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)

    def build_metadata(self, batch: AttentionBatch) -> FlashAttnMetadata:
        """cu_seqlens, key counts and the decode-only flag from the host lists, copied to the device once."""
        return planning.build_metadata(batch, self.spec.device)

    def write_kv(self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, metadata) -> None:
        """Scatter this step's K/V into their slots (padded slots -1 skipped)."""
        store_kv(kv_cache[0], kv_cache[1], key, value, metadata.slot_mapping)

    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, metadata, layer_idx: int) -> torch.Tensor:
        """One flash-attn call with the layer's scale, window ``(w - 1, 0)`` and soft-cap."""
        varlen, with_kvcache = self._kernels
        scale, window, softcap = self._layer_args[layer_idx]
        m = metadata
        common = dict(softmax_scale=scale, causal=True, window_size=window, softcap=softcap, block_table=m.block_table)
        if not m.decode_only:
            return varlen(
                query, kv_cache[0], kv_cache[1], m.cu_seqlens_q, m.cu_seqlens_k, m.max_seqlen_q, m.max_seqlen_k,
                **common,
            )  # fmt: skip
        n = m.num_seqs  # rows past n are CUDA-graph padding
        out = with_kvcache(query[:n].unsqueeze(1), kv_cache[0], kv_cache[1], cache_seqlens=m.seqused_k, **common)
        out = out.squeeze(1)
        return out if n == query.shape[0] else torch.cat([out, out.new_zeros(query.shape[0] - n, *out.shape[1:])])

    @cached_property
    def _kernels(self) -> tuple[Any, Any]:
        """``flash_attn_varlen_func`` and ``flash_attn_with_kvcache``, imported on the first forward:
        everything before (sizing, planning, storing K/V) runs without the CUDA extension."""
        from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

        return flash_attn_varlen_func, flash_attn_with_kvcache
