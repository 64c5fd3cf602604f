"""Deliberately broken copies of the CPU attention backend: each breaks one rule of the contract.

Test fixtures for ``core/tests/test_contract_mutants.py``, which asserts that the attention
contract fails each of them with a message naming the broken behaviour. Also installed as the
"broken third-party package" that ``kvserve plugins check`` must reject.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvserve_attention_cpu.backend import CpuAttentionBackend


class WrongSlotWrite(CpuAttentionBackend):
    """Stores each token one slot before the one ``slot_mapping`` gives."""

    name = "cpu_wrong_slot"

    def write_kv(self, kv_cache, key, value, metadata) -> None:
        slots = metadata.batch.slot_mapping - 1
        kv_cache[0].view(-1, *key.shape[1:])[slots] = key
        kv_cache[1].view(-1, *value.shape[1:])[slots] = value


class CausalOffByOne(CpuAttentionBackend):
    """Prefill queries also see the next token (``<=`` against ``position + 1``)."""

    name = "cpu_causal_off_by_one"

    @staticmethod
    def _causal(q, keys, values, seq_len: int, scale: float, gqa: bool) -> torch.Tensor:
        query_pos = torch.arange(seq_len - q.shape[2], seq_len)[:, None]
        mask = torch.arange(seq_len)[None, :] <= query_pos + 1
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale, enable_gqa=gqa)


class GqaTiledHeads(CpuAttentionBackend):
    """Expands KV heads by tiling (query head h reads KV head h % num_kv_heads) instead of grouping."""

    name = "cpu_gqa_tiled"

    def _gather(self, kv_cache, batch, seqs, length):
        keys, values = super()._gather(kv_cache, batch, seqs, length)
        group = self.spec.num_heads // self.spec.num_kv_heads
        return keys.repeat(1, group, 1, 1), values.repeat(1, group, 1, 1)
