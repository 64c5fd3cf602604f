"""Paged attention in plain PyTorch, the path that runs where the C++ kernel cannot be built: gathers
each sequence's KV through its block table and runs ``scaled_dot_product_attention``. Decodes are
batched together (padded to the longest); prefills run per sequence.

The decodes' block list is computed once per step (shared by every layer), so each layer reads
its K and V with one block-granular ``index_select`` along dimension 0 each (measured 7x faster than
one ``index_select`` along the cache's block dimension 1 over K and V together).
bfloat16 decodes use explicit grouped matmuls with a float32 softmax: measured ~3x faster on the
CPU than ``scaled_dot_product_attention``'s flash kernel for one query token; float32 keeps SDPA
(faster there), float16 too (its fp16 probability matmul misses the contract's tolerance).

Sliding windows are masks; layers with a logit soft-cap compute their scores explicitly
(``scaled_dot_product_attention`` has no hook between the scores and the softmax).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvserve.interfaces import AttentionBackend, AttentionBatch, AttentionSpec, LayerAttentionSpec, Platform


@dataclass
class TorchPagedMetadata:
    batch: AttentionBatch
    decode_seqs: list[int]
    """Sequences with one new token, attended in a single padded call."""
    prefill_seqs: list[int]
    decode_token_index: torch.Tensor | None
    """Rows of the decodes' tokens in the batch; None: the batch is decodes only (every row, in order)."""
    decode_blocks: torch.Tensor | None
    """The decodes' block tables up to the longest decode, flattened: ``[num_decodes * blocks]``
    (entries past a sequence's end read block 0 and are masked out)."""
    decode_masks: dict[LayerAttentionSpec, torch.Tensor]
    """Per layer kind, bool ``[num_decodes, 1, 1, max_decode_len]``: True where a key is visible."""
    prefill_masks: dict[tuple[int, LayerAttentionSpec], torch.Tensor | None]
    """Per (prefill sequence, layer kind), bool ``[query_len, seq_len]``; None: plain causal over the whole sequence."""
    write_index: torch.Tensor | None
    """Tokens that have a cache slot (slot -1 is padding); None: every token."""


class TorchPagedBackend(AttentionBackend):
    """The PyTorch path of :class:`~kvserve_attention_cpu.backend.CpuAttentionBackend` (its base):
    KV layout ``(2, num_blocks, block_size, num_kv_heads, head_dim)``, K then V."""

    device_types = ("cpu",)
    supported_dtypes = ("float32", "bfloat16", "float16")
    default_block_size = 16

    @classmethod
    def unsupported_reasons(cls, spec: AttentionSpec, platform: Platform) -> list[str]:
        reasons = super().unsupported_reasons(spec, platform)
        if spec.cache_dtype != spec.dtype:
            cache_dtype = str(spec.cache_dtype).removeprefix("torch.")
            reasons.append(f"kv_cache_dtype {cache_dtype} not supported (K/V are stored in the model dtype)")
        return reasons

    def kernels(self) -> str:
        decode = "grouped matmul, float32 softmax" if self.spec.dtype == torch.bfloat16 else "SDPA"
        return f"decode: {decode} over gathered blocks; prefill: SDPA per sequence"

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        spec = self.spec
        return (2, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)

    def build_metadata(self, batch: AttentionBatch) -> TorchPagedMetadata:
        device = self.spec.device
        kinds = self.spec.layer_kinds
        decodes = [i for i, n in enumerate(batch.query_lens_host) if n == 1]
        prefills = [i for i, n in enumerate(batch.query_lens_host) if n != 1]
        decode_masks = {}
        decode_blocks = None
        if decodes:
            lens = torch.tensor([batch.seq_lens_host[i] for i in decodes], device=device)
            max_len = max(batch.seq_lens_host[i] for i in decodes)  # from the host copy: no device sync
            key_pos = torch.arange(max_len, device=device)[None, :]
            for kind in kinds:
                decode_masks[kind] = self._visible(lens[:, None] - 1, key_pos, kind.sliding_window)[:, None, None, :]
            decode_blocks = batch.block_tables[decodes, : -(-max_len // batch.block_size)].long().flatten()
        prefill_masks = self._prefill_masks(batch, prefills)
        index = None
        if prefills or batch.slot_mapping.shape[0] != len(decodes):  # mixed, or padded rows
            index = torch.tensor([batch.query_start_loc_host[i] for i in decodes], dtype=torch.long, device=device)
        return TorchPagedMetadata(
            batch, decodes, prefills, index, decode_blocks, decode_masks, prefill_masks, write_index(batch)
        )

    def write_kv(self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, metadata) -> None:
        slots = metadata.batch.slot_mapping
        if metadata.write_index is not None:
            slots, key, value = slots[metadata.write_index], key[metadata.write_index], value[metadata.write_index]
        kv_cache[0].view(-1, *key.shape[1:]).index_copy_(0, slots, key)
        kv_cache[1].view(-1, *value.shape[1:]).index_copy_(0, slots, value)

    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, metadata, layer_idx: int) -> torch.Tensor:
        layer = self.spec.layers[layer_idx]
        batch = metadata.batch
        if metadata.decode_seqs:
            mask = metadata.decode_masks[layer]
            keys, values = self._gather_blocks(kv_cache, metadata.decode_blocks, len(metadata.decode_seqs))
            keys, values = keys[:, :, : mask.shape[-1]], values[:, :, : mask.shape[-1]]
            index = metadata.decode_token_index
            if index is None:  # decodes only: no row gather or scatter
                return self._decode(query, keys, values, mask, layer)
            out = torch.empty_like(query)
            out[index] = self._decode(query[index], keys, values, mask, layer)
        else:
            out = torch.empty_like(query)
        self._attend_prefills(out, query, kv_cache, batch, metadata.prefill_seqs, metadata.prefill_masks, layer)
        return out

    def _prefill_masks(self, batch: AttentionBatch, seqs: list[int]) -> dict:
        """:meth:`_prefill_mask` of each of ``seqs`` for each layer kind, keyed ``(seq, kind)``."""
        lens, q_lens = batch.seq_lens_host, batch.query_lens_host
        return {(i, kind): self._prefill_mask(lens[i], q_lens[i], kind) for i in seqs for kind in self.spec.layer_kinds}

    def _attend_prefills(self, out, query, kv_cache, batch: AttentionBatch, seqs: list[int], masks: dict, layer):
        """Attention of each of ``seqs`` (one SDPA call each over its gathered K/V) into its rows of ``out``."""
        for i in seqs:
            start, end = batch.query_start_loc_host[i], batch.query_start_loc_host[i + 1]
            keys, values = self._gather(kv_cache, batch, [i], batch.seq_lens_host[i])
            q = query[start:end].transpose(0, 1).unsqueeze(0)  # [1, heads, q, d]
            out[start:end] = self._attend(q, keys, values, masks[(i, layer)], layer)[0].transpose(0, 1)

    def _decode(self, q, keys, values, mask: torch.Tensor, layer: LayerAttentionSpec) -> torch.Tensor:
        """One query token per sequence: ``q`` ``[n, heads, d]`` -> ``[n, heads, d]``; rest as in ``_attend``."""
        if q.dtype != torch.bfloat16 or layer.logits_soft_cap is not None:
            return self._attend(q.unsqueeze(2), keys, values, mask, layer).squeeze(2)
        return grouped_decode_attention(q, keys, values, mask, layer.scale)

    def _attend(self, q, keys, values, mask: torch.Tensor | None, layer: LayerAttentionSpec) -> torch.Tensor:
        """``q`` ``[n, heads, q, d]`` over ``keys``/``values`` ``[n, kv_heads, L, d]`` where ``mask``
        (broadcast to ``[n, heads, q, L]``) is True; None: causal with ``q == L``."""
        gqa = self.spec.num_heads != self.spec.num_kv_heads
        if layer.logits_soft_cap is not None:
            return soft_capped_attention(q, keys, values, mask, layer.scale, layer.logits_soft_cap)
        if mask is None:
            return F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=layer.scale, enable_gqa=gqa)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=layer.scale, enable_gqa=gqa)

    def _prefill_mask(self, seq_len: int, q_len: int, layer: LayerAttentionSpec) -> torch.Tensor | None:
        """Visibility ``[q_len, seq_len]`` of the last ``q_len`` positions of a sequence; None
        when SDPA's own causal mask is exactly it (a whole sequence, no window, no soft-cap)."""
        if q_len == seq_len and layer.sliding_window is None and layer.logits_soft_cap is None:
            return None
        device = self.spec.device
        query_pos = torch.arange(seq_len - q_len, seq_len, device=device)[:, None]
        return self._visible(query_pos, torch.arange(seq_len, device=device)[None, :], layer.sliding_window)

    @staticmethod
    def _visible(query_pos: torch.Tensor, key_pos: torch.Tensor, window: int | None) -> torch.Tensor:
        """True where the key at ``key_pos`` is visible from ``query_pos`` (broadcast): causal, within ``window``."""
        mask = key_pos <= query_pos
        if window is not None:
            mask &= key_pos > query_pos - window
        return mask

    @staticmethod
    def _gather_blocks(kv_cache: torch.Tensor, blocks: torch.Tensor, n: int):
        """K and V of the flattened per-sequence ``blocks`` as ``[n, kv_heads, blocks * block_size, d]``
        strided views of one copy each."""
        return select_blocks(kv_cache, blocks, n)

    @staticmethod
    def _gather(kv_cache: torch.Tensor, batch: AttentionBatch, seqs: list[int], length: int):
        """K and V of ``seqs`` as ``[n, kv_heads, length, d]`` (rows past a sequence's end are junk)."""
        tables = batch.block_tables[seqs, : -(-length // batch.block_size)].long()
        keys, values = select_blocks(kv_cache, tables.flatten(), len(seqs))
        return keys[:, :, :length], values[:, :, :length]


def select_blocks(kv_cache: torch.Tensor, blocks: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of the flattened per-sequence ``blocks`` (int64) as ``[n, kv_heads, blocks * block_size, d]``
    views: one ``index_select`` along each half's leading block dimension (7x faster than one along
    dimension 1 of the whole cache)."""
    _, num_blocks, _, kv_heads, head_dim = kv_cache.shape
    keys = kv_cache[0].view(num_blocks, -1).index_select(0, blocks)
    values = kv_cache[1].view(num_blocks, -1).index_select(0, blocks)
    return keys.view(n, -1, kv_heads, head_dim).transpose(1, 2), values.view(n, -1, kv_heads, head_dim).transpose(1, 2)


def write_index(batch: AttentionBatch) -> torch.Tensor | None:
    """Rows of the tokens that have a cache slot (slot -1 is padding); None: every row."""
    padded = batch.slot_mapping < 0  # read on the host: free on the CPU, the only device this runs on
    return (~padded).nonzero().squeeze(1) if bool(padded.any()) else None


def grouped_decode_attention(q, keys, values, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """One query token per sequence, ``q`` ``[n, heads, d]``, over ``keys``/``values``
    ``[n, kv_heads, L, d]`` where ``mask`` ``[n, 1, 1, L]`` is True; matmuls in the input dtype,
    softmax in float32. Query head h reads KV head h // (heads // kv_heads)."""
    n, heads, head_dim = q.shape
    kv_heads = keys.shape[1]
    grouped = q.view(n, kv_heads, heads // kv_heads, head_dim)
    scores = torch.matmul(grouped, keys.transpose(-1, -2)).float().mul_(scale)  # [n, kv_heads, group, L]
    probs = scores.masked_fill_(~mask, float("-inf")).softmax(dim=-1).to(q.dtype)
    return torch.matmul(probs, values).reshape(n, heads, head_dim)


def soft_capped_attention(q, keys, values, mask: torch.Tensor, scale: float, cap: float) -> torch.Tensor:
    """Attention with scores ``cap * tanh(q·k * scale / cap)``, in float32; shapes and mask as in
    :meth:`TorchPagedBackend._attend`."""
    n, heads, q_len, head_dim = q.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads  # query head h reads KV head h // group
    grouped = q.float().reshape(n, kv_heads, group, q_len, head_dim)
    scores = grouped @ keys.float().unsqueeze(2).transpose(-1, -2) * scale  # [n, kv_heads, group, q, L]
    scores = cap * torch.tanh(scores / cap)
    if mask.dim() == 4:  # [n, 1, q, L] -> [n, 1, 1, q, L]
        mask = mask.unsqueeze(1)
    probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    out = probs @ values.float().unsqueeze(2)  # [n, kv_heads, group, q, d]
    return out.reshape(n, heads, q_len, head_dim).to(q.dtype)
