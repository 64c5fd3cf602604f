"""Paged attention in plain PyTorch: gathers each sequence's KV through its block table and
runs ``scaled_dot_product_attention``. Decodes are batched together; prefills run per sequence."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvserve.interfaces import AttentionBackend, AttentionBatch


@dataclass
class CpuAttentionMetadata:
    batch: AttentionBatch
    decode_seqs: list[int]
    """Sequences with one new token, attended in a single padded call."""
    prefill_seqs: list[int]
    decode_token_index: torch.Tensor
    decode_key_mask: torch.Tensor | None
    """bool ``[num_decodes, 1, 1, max_decode_len]``: True where a key position is inside the sequence."""


class CpuAttentionBackend(AttentionBackend):
    """KV layout ``(2, num_blocks, block_size, num_kv_heads, head_dim)``: K then V."""

    name = "cpu"
    device_types = ("cpu",)
    supported_dtypes = ("float32", "bfloat16", "float16")
    default_block_size = 16

    @classmethod
    def kv_cache_shape(cls, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        return (2, num_blocks, block_size, num_kv_heads, head_dim)

    def build_metadata(self, batch: AttentionBatch) -> CpuAttentionMetadata:
        decodes = [i for i, n in enumerate(batch.query_lens_host) if n == 1]
        prefills = [i for i, n in enumerate(batch.query_lens_host) if n != 1]
        device = self.spec.device
        mask = None
        if decodes:
            lens = torch.tensor([batch.seq_lens_host[i] for i in decodes], device=device)
            max_len = max(batch.seq_lens_host[i] for i in decodes)  # from the host copy: no device sync
            mask = (torch.arange(max_len, device=device)[None, :] < lens[:, None])[:, None, None, :]
        index = torch.tensor([batch.query_start_loc_host[i] for i in decodes], dtype=torch.long, device=device)
        return CpuAttentionMetadata(batch, decodes, prefills, index, mask)

    def write_kv(self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, metadata) -> None:
        slots = metadata.batch.slot_mapping
        kv_cache[0].view(-1, *key.shape[1:])[slots] = key
        kv_cache[1].view(-1, *value.shape[1:])[slots] = value

    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, metadata, scale: float) -> torch.Tensor:
        batch = metadata.batch
        out = torch.empty_like(query)
        gqa = self.spec.num_heads != self.spec.num_kv_heads
        if metadata.decode_seqs:
            max_len = metadata.decode_key_mask.shape[-1]
            keys, values = self._gather(kv_cache, batch, metadata.decode_seqs, max_len)
            q = query[metadata.decode_token_index].unsqueeze(2)  # [n, heads, 1, d]
            attn = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=metadata.decode_key_mask, scale=scale, enable_gqa=gqa
            )
            out[metadata.decode_token_index] = attn.squeeze(2)
        for i in metadata.prefill_seqs:
            start, end = batch.query_start_loc_host[i], batch.query_start_loc_host[i + 1]
            keys, values = self._gather(kv_cache, batch, [i], batch.seq_lens_host[i])
            q = query[start:end].transpose(0, 1).unsqueeze(0)  # [1, heads, q, d]
            out[start:end] = self._causal(q, keys, values, batch.seq_lens_host[i], scale, gqa)[0].transpose(0, 1)
        return out

    @staticmethod
    def _gather(kv_cache: torch.Tensor, batch: AttentionBatch, seqs: list[int], length: int):
        """K and V of ``seqs`` as ``[n, kv_heads, length, d]`` (rows past a sequence's end are junk)."""
        num_blocks = -(-length // batch.block_size)
        tables = batch.block_tables[seqs, :num_blocks].long()
        k = kv_cache[0][tables].flatten(1, 2)[:, :length]  # [n, length, kv_heads, d]
        v = kv_cache[1][tables].flatten(1, 2)[:, :length]
        return k.transpose(1, 2), v.transpose(1, 2)

    @staticmethod
    def _causal(q, keys, values, seq_len: int, scale: float, gqa: bool) -> torch.Tensor:
        """Causal attention where the ``q_len`` queries are the last positions of a ``seq_len`` sequence."""
        q_len = q.shape[2]
        if q_len == seq_len:
            return F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=scale, enable_gqa=gqa)
        query_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
        mask = torch.arange(seq_len, device=q.device)[None, :] <= query_pos
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale, enable_gqa=gqa)
