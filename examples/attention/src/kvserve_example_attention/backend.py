"""Slow, obviously correct paged attention: each sequence's keys and values are gathered slot by
slot through its block table, then every query attends to the positions its layer lets it see."""

from __future__ import annotations

import torch

from kvserve.interfaces import AttentionBackend, AttentionBatch


class NaiveAttentionBackend(AttentionBackend):
    """KV layout ``(num_blocks, 2, block_size, num_kv_heads, head_dim)``: block-major, K then V
    inside each block (the layout is the backend's choice; the engine only sizes and allocates it)."""

    name = "naive"
    device_types = ("cpu",)
    supported_dtypes = ("float32", "bfloat16")
    default_block_size = 8

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        spec = self.spec
        return (num_blocks, 2, spec.block_size, spec.num_kv_heads, spec.head_dim)

    def build_metadata(self, batch: AttentionBatch) -> AttentionBatch:
        return batch  # everything forward needs is in the batch description

    def write_kv(self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, metadata: AttentionBatch):
        for token, slot in enumerate(metadata.slot_mapping.tolist()):
            if slot < 0:  # a padded token: nothing to store
                continue
            block, offset = divmod(slot, metadata.block_size)
            kv_cache[block, 0, offset] = key[token]
            kv_cache[block, 1, offset] = value[token]

    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionBatch, layer_idx: int):
        layer = self.spec.layers[layer_idx]  # this layer's scale, sliding window and soft-cap
        batch = metadata
        out = torch.empty_like(query)
        group = self.spec.num_heads // self.spec.num_kv_heads  # query heads per KV head
        for seq, seq_len in enumerate(batch.seq_lens_host):
            start, end = batch.query_start_loc_host[seq], batch.query_start_loc_host[seq + 1]
            table = batch.block_tables_host[seq].tolist()
            where = [divmod(p, batch.block_size) for p in range(seq_len)]  # position -> (table index, offset)
            keys = torch.stack([kv_cache[table[i], 0, offset] for i, offset in where]).float()
            values = torch.stack([kv_cache[table[i], 1, offset] for i, offset in where]).float()
            # Query head h reads KV head h // group.
            keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
            q = query[start:end].float()
            scores = torch.einsum("qhd,khd->hqk", q, keys) * layer.scale
            if layer.logits_soft_cap is not None:
                scores = layer.logits_soft_cap * torch.tanh(scores / layer.logits_soft_cap)
            query_pos = torch.arange(seq_len - (end - start), seq_len)[:, None]
            key_pos = torch.arange(seq_len)[None, :]
            hidden = key_pos > query_pos  # causal: no later positions
            if layer.sliding_window is not None:  # nor keys that fell out of the window
                hidden |= key_pos <= query_pos - layer.sliding_window
            probs = scores.masked_fill(hidden, float("-inf")).softmax(dim=-1)
            out[start:end] = torch.einsum("hqk,khd->qhd", probs, values).to(query.dtype)
        return out
