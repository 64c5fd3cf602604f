"""The arrays this backend hands flash-attn, checked on the CPU: against the block tables, and by a
pure-PyTorch model of the two kernels' documented semantics that must reproduce a float64
reference of paged attention (sliding windows and soft-caps included).

What the model of the kernels follows (flash-attn 2.6-2.8 docstrings of ``flash_attn_varlen_func``
and ``flash_attn_with_kvcache``): with ``block_table``, sequence ``i``'s keys are the first
``seqlen_k`` slots of the pages ``block_table[i]`` (``seqlen_k = cu_seqlens_k[i+1] - cu_seqlens_k[i]``,
or ``cache_seqlens[i]``); its queries are rows ``cu_seqlens_q[i]:cu_seqlens_q[i+1]``; the causal
mask is aligned to the bottom right, so query ``j`` of ``seqlen_q`` attends keys in
``[j + seqlen_k - seqlen_q - left, j + seqlen_k - seqlen_q + right]`` (``right`` is 0 when causal,
``left = -1`` unbounded); scores are ``softcap * tanh(q.k * softmax_scale / softcap)`` when
``softcap > 0``; query head ``h`` reads KV head ``h // (nheads // nheads_k)``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvserve.testing.attention_reference import (
    filled_cache,
    layer_reference_attention,
    make_paged_case,
    past_batch,
    random_paged_case,
    step_params,
    token_slots,
)
from kvserve_attention_flash_attn.backend import FlashAttnBackend
from kvserve_attention_flash_attn.metadata import build_metadata, varlen_arrays, window_size


def bottom_right_attention(q, keys, values, scale, window, softcap):
    """float64 ``[seqlen_q, heads, d]``: flash-attn's mask and soft-cap for one sequence."""
    seqlen_q, heads = q.shape[:2]
    seqlen_k, kv_heads = keys.shape[:2]
    kv_head_of = torch.arange(heads) // (heads // kv_heads)
    scores = torch.einsum("qhd,khd->hqk", q.double(), keys.double()[:, kv_head_of]) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    left, right = window
    shift = torch.arange(seqlen_q)[:, None] + seqlen_k - seqlen_q  # query j's bottom-right-aligned position
    j = torch.arange(seqlen_k)[None, :]
    visible = j <= shift + (0 if right < 0 else right)  # causal=True forces right to 0
    if left >= 0:
        visible &= j >= shift - left
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", probs, values.double()[:, kv_head_of])


def paged_keys(cache, table, seqlen_k):
    return cache[table.long()].flatten(0, 1)[:seqlen_k]


def varlen_model(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, softmax_scale, window_size, softcap, block_table):
    """``flash_attn_varlen_func(..., causal=True, block_table=...)`` as documented."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    for i in range(len(cu_seqlens_q) - 1):
        rows = slice(int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1]))
        seqlen_k = int(cu_seqlens_k[i + 1] - cu_seqlens_k[i])
        keys, values = (paged_keys(c, block_table[i], seqlen_k) for c in (k_cache, v_cache))
        out[rows] = bottom_right_attention(q[rows], keys, values, softmax_scale, window_size, softcap)
    return out


def with_kvcache_model(q, k_cache, v_cache, cache_seqlens, softmax_scale, window_size, softcap, block_table):
    """``flash_attn_with_kvcache(q [batch, seqlen_q, heads, d], ..., causal=True, block_table=...)``."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    for i in range(q.shape[0]):
        seqlen_k = int(cache_seqlens[i])
        keys, values = (paged_keys(c, block_table[i], seqlen_k) for c in (k_cache, v_cache))
        out[i] = bottom_right_attention(q[i], keys, values, softmax_scale, window_size, softcap)
    return out


SHAPES = dict(
    block_sizes=[256, 512], windows=[None, 1, 5, 64, 300],
    max_seqs=5, short_context=40, long_context=(200, 700), max_query=40,
)  # fmt: skip
"""Random steps: flash-attn's block sizes (multiples of 256), windows within and beyond a block."""


@pytest.mark.parametrize(("seed", "decode_only"), step_params(24))
def test_kernel_model_on_these_arrays_equals_paged_attention(seed, decode_only):
    case, layer = random_paged_case(seed, decode_only, **SHAPES)
    cache = filled_cache(case, kv_dim=0, seed=seed)
    meta = build_metadata(case.batch, torch.device("cpu"))
    assert meta.decode_only == all(n == 1 for n in case.batch.query_lens_host)

    scale, window, softcap = layer.scale, window_size(layer.sliding_window), layer.logits_soft_cap or 0.0
    if meta.decode_only:
        got = with_kvcache_model(
            case.query.unsqueeze(1), cache[0], cache[1], meta.seqused_k, scale, window, softcap, meta.block_table
        ).squeeze(1)
    else:
        got = varlen_model(
            case.query, cache[0], cache[1], meta.cu_seqlens_q, meta.cu_seqlens_k, scale, window, softcap,
            meta.block_table,
        )  # fmt: skip
    torch.testing.assert_close(got, layer_reference_attention(case, layer), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(30))
def test_arrays_agree_with_the_block_tables(seed):
    case, _ = random_paged_case(seed, decode_only=seed % 3 == 0, head_dim=8, **SHAPES)
    batch = case.batch
    block_size, seqs = batch.block_size, list(zip(case.context_lens, batch.query_lens_host))
    arrays = varlen_arrays(batch.query_start_loc_host, batch.seq_lens_host)
    assert arrays.cu_seqlens_q.dtype == arrays.cu_seqlens_k.dtype == arrays.seqused_k.dtype == np.int32
    assert list(np.diff(arrays.cu_seqlens_q)) == [q for _, q in seqs]
    assert list(np.diff(arrays.cu_seqlens_k)) == list(arrays.seqused_k) == [c + q for c, q in seqs]
    assert arrays.max_seqlen_q == max(q for _, q in seqs) and arrays.max_seqlen_k == max(c + q for c, q in seqs)
    assert arrays.decode_only == all(q == 1 for _, q in seqs)
    # The table row and seqused_k reach exactly the slots the sequence's tokens were written to.
    for i, seq_len in enumerate(arrays.seqused_k):
        reachable = token_slots(batch.block_tables[i], 0, int(seq_len), block_size)
        assert torch.equal(reachable, token_slots(case.tables[i], 0, int(seq_len), block_size))
        starts = batch.query_start_loc_host
        new = reachable[int(seq_len) - (starts[i + 1] - starts[i]) :]
        assert torch.equal(new, batch.slot_mapping[starts[i] : starts[i + 1]])


def test_device_metadata_holds_the_host_arrays():
    case = make_paged_case([(0, 7), (5, 1), (300, 9)], 4, 2, 64, 256, 8, seed=2)
    meta = build_metadata(case.batch, torch.device("cpu"))
    arrays = varlen_arrays(case.batch.query_start_loc_host, case.batch.seq_lens_host)
    for name in ("cu_seqlens_q", "cu_seqlens_k", "seqused_k"):
        tensor = getattr(meta, name)
        assert tensor.dtype == torch.int32 and tensor.is_contiguous()
        assert tensor.tolist() == getattr(arrays, name).tolist()
    assert meta.block_table is case.batch.block_tables and meta.num_seqs == 3


def test_window_size_counts_the_query_itself():
    assert window_size(None) == (-1, -1)
    assert window_size(1) == (0, 0)  # sees only itself
    assert window_size(4096) == (4095, 0)


# -- the backend end to end, flash-attn's two functions standing in as the models above --------


def flash_attn_varlen_func(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None,
    causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
    return_attn_probs=False, block_table=None,
):  # fmt: skip
    """flash-attn 2.6.0-2.8.3's signature, computed by :func:`varlen_model`."""
    assert causal and block_table is not None and dropout_p == 0.0 and alibi_slopes is None
    assert max_seqlen_q == int(np.diff(cu_seqlens_q).max()) and max_seqlen_k == int(np.diff(cu_seqlens_k).max())
    out = varlen_model(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, window_size, softcap, block_table)
    return out.to(q.dtype)


def flash_attn_with_kvcache(
    q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
    cache_leftpad=None, block_table=None, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
    rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False,
):  # fmt: skip
    """flash-attn 2.6.3-2.8.3's signature, computed by :func:`with_kvcache_model`."""
    assert causal and block_table is not None and k is None and v is None and cache_batch_idx is None
    out = with_kvcache_model(q, k_cache, v_cache, cache_seqlens, softmax_scale, window_size, softcap, block_table)
    return out.to(q.dtype)


@pytest.mark.parametrize("decode_only", [False, True], ids=["mixed", "decode"])
def test_backend_calls_the_kernels_so_that_each_layer_gets_its_own_attention(decode_only):
    """``build_metadata``, ``write_kv`` and ``forward`` of the real backend, with the two flash-attn
    functions replaced by the models above under their released signatures: the calls bind as they
    would on a GPU, and each layer's output equals float64 paged attention with its own scale,
    window and soft-cap."""
    from kvserve.interfaces import AttentionSpec, LayerAttentionSpec

    layers = (LayerAttentionSpec(0.3, sliding_window=5, logits_soft_cap=1.5), LayerAttentionSpec(0.125))
    spec = AttentionSpec(8, 2, 64, torch.float32, 256, torch.device("cpu"), layers=layers)
    backend = FlashAttnBackend(spec)
    backend.__dict__["_kernels"] = (flash_attn_varlen_func, flash_attn_with_kvcache)
    seqs = [(300, 1), (20, 1), (7, 1)] if decode_only else [(0, 9), (300, 1), (20, 6), (7, 1)]
    case = make_paged_case(seqs, 8, 2, 64, 256, seed=11)
    past_step, past_keys, past_values = past_batch(case)
    for layer_idx, (cache, layer) in enumerate(zip(backend.allocate_kv_cache(case.num_blocks), layers)):
        backend.write_kv(cache, past_keys, past_values, backend.build_metadata(past_step))
        metadata = backend.build_metadata(case.batch)
        assert metadata.decode_only == decode_only
        backend.write_kv(cache, case.key, case.value, metadata)
        out = backend.forward(case.query, cache, metadata, layer_idx)
        torch.testing.assert_close(out.double(), layer_reference_attention(case, layer), atol=1e-5, rtol=1e-5)
