"""Deliberately broken copies of the CPU attention backend: each breaks one rule of the contract.

Test fixtures for ``core/tests/test_contract_mutants.py``, which asserts that the attention
contract fails each of them with a message naming the broken behaviour. Also installed as the
"broken third-party package" that ``kvserve plugins check`` must reject.
"""

from __future__ import annotations

import torch

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
    native = False  # the bug is in the PyTorch path, which the C++ kernel would bypass

    def _prefill_mask(self, seq_len: int, q_len: int, layer) -> torch.Tensor:
        query_pos = torch.arange(seq_len - q_len, seq_len)[:, None]
        return torch.arange(seq_len)[None, :] <= query_pos + 1


class WindowOffByOne(CpuAttentionBackend):
    """A sliding window of ``sliding_window + 1`` keys (``>=`` where ``>`` belongs), in prefills and decodes."""

    name = "cpu_window_off_by_one"
    native = False  # the bug is in the PyTorch path, which the C++ kernel would bypass

    @staticmethod
    def _visible(query_pos: torch.Tensor, key_pos: torch.Tensor, window: int | None) -> torch.Tensor:
        mask = key_pos <= query_pos
        if window is not None:
            mask &= key_pos >= query_pos - window
        return mask


class GqaTiledHeads(CpuAttentionBackend):
    """Expands KV heads by tiling (query head h reads KV head h % num_kv_heads) instead of grouping."""

    name = "cpu_gqa_tiled"
    native = False  # the bug is in the PyTorch path, which the C++ kernel would bypass

    def _gather(self, kv_cache, batch, seqs, length):
        return self._tile(*super()._gather(kv_cache, batch, seqs, length))

    def _gather_blocks(self, kv_cache, blocks, n):
        return self._tile(*super()._gather_blocks(kv_cache, blocks, n))

    def _tile(self, keys, values):
        group = self.spec.num_heads // self.spec.num_kv_heads
        return keys.repeat(1, group, 1, 1), values.repeat(1, group, 1, 1)


class LookaheadSeesAhead(CpuAttentionBackend):
    """A verification step's short query (2 to 8 tokens after cached ones) attends without causality
    among its own rows: each row also sees the step's later tokens."""

    name = "cpu_lookahead_sees_ahead"
    native = False  # the bug is in the PyTorch path, which the C++ kernel would bypass

    def _prefill_mask(self, seq_len: int, q_len: int, layer) -> torch.Tensor | None:
        mask = super()._prefill_mask(seq_len, q_len, layer)
        if 1 < q_len <= 8 and seq_len > q_len:
            mask = mask.clone()
            mask[:, seq_len - q_len :] = True
        return mask
