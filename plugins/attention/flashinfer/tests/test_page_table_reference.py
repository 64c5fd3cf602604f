"""The CSR page tables this backend plans FlashInfer with, checked on the CPU: against the block
tables, and by a pure-PyTorch model of the wrappers' documented semantics that must reproduce a
float64 reference of paged attention (sliding windows and soft-caps included).

What the model follows (FlashInfer 0.2-0.7 docs of ``BatchPrefillWithPagedKVCacheWrapper`` and
``BatchDecodeWithPagedKVCacheWrapper``): with the "NHD" layout the paged cache is
``(max_num_pages, 2, page_size, num_kv_heads, head_dim)``; request ``i``'s keys are the pages
``paged_kv_indices[paged_kv_indptr[i]:paged_kv_indptr[i+1]]`` in order, all full but the last,
which holds ``paged_kv_last_page_len[i]`` tokens; its queries are rows
``qo_indptr[i]:qo_indptr[i+1]``, aligned to the end of its keys (``causal=True``; a decode's one
query is the last position); ``window_left`` keys before a query stay visible (-1: all); the
logits are ``logits_soft_cap * tanh(q.k * sm_scale / logits_soft_cap)`` when a cap is given;
query head ``h`` reads KV head ``h // (num_qo_heads // num_kv_heads)``.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

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
from kvserve_attention_flashinfer.backend import window_left
from kvserve_attention_flashinfer.page_table import page_tables


def paged_prefill_model(q, paged_kv_cache, tables, sm_scale, window_left, logits_soft_cap):
    """float64 output of ``plan(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
    ..., causal=True, sm_scale, window_left, logits_soft_cap)`` then ``run(q, paged_kv_cache)``."""
    page_size = paged_kv_cache.shape[2]
    heads, kv_heads = q.shape[1], paged_kv_cache.shape[3]
    kv_head_of = torch.arange(heads) // (heads // kv_heads)
    out = torch.zeros(q.shape, dtype=torch.float64)
    for i in range(len(tables.qo_indptr) - 1):
        pages = torch.from_numpy(tables.paged_kv_indices[tables.paged_kv_indptr[i] : tables.paged_kv_indptr[i + 1]])
        kv_len = (len(pages) - 1) * page_size + int(tables.paged_kv_last_page_len[i])
        keys = paged_kv_cache[pages.long(), 0].flatten(0, 1)[:kv_len].double()[:, kv_head_of]
        values = paged_kv_cache[pages.long(), 1].flatten(0, 1)[:kv_len].double()[:, kv_head_of]
        rows = slice(int(tables.qo_indptr[i]), int(tables.qo_indptr[i + 1]))
        qo_len = rows.stop - rows.start
        logits = torch.einsum("qhd,khd->hqk", q[rows].double(), keys) * sm_scale
        if logits_soft_cap:
            logits = logits_soft_cap * torch.tanh(logits / logits_soft_cap)
        position = kv_len - qo_len + torch.arange(qo_len)[:, None]
        k = torch.arange(kv_len)[None, :]
        visible = (k <= position) & ((k >= position - window_left) if window_left >= 0 else True)
        probs = logits.masked_fill(~visible, float("-inf")).softmax(-1).nan_to_num(0.0)
        out[rows] = torch.einsum("hqk,khd->qhd", probs, values)
    return out


SHAPES = dict(
    block_sizes=[1, 5, 16, 32], windows=[None, 1, 3, 17, 60],
    max_seqs=6, short_context=20, long_context=(50, 130), max_query=30,
)  # fmt: skip
"""Random steps: page sizes from one token to 32, windows within and beyond a page."""


def host_block_tables(batch) -> np.ndarray:
    """``batch.block_tables_host``: the block tables as the host holds them."""
    return batch.block_tables.numpy()


@pytest.mark.parametrize(("seed", "decode_only"), step_params(24))
def test_wrapper_model_on_these_tables_equals_paged_attention(seed, decode_only):
    case, layer = random_paged_case(seed, decode_only, **SHAPES)
    cache = filled_cache(case, kv_dim=1, seed=seed)
    batch = case.batch
    tables = page_tables(batch.query_start_loc_host, batch.seq_lens_host, host_block_tables(batch), batch.block_size)
    assert tables.decode_only == all(n == 1 for n in batch.query_lens_host)

    window = window_left(layer.sliding_window)
    got = paged_prefill_model(case.query, cache, tables, layer.scale, window, layer.logits_soft_cap)
    torch.testing.assert_close(got, layer_reference_attention(case, layer), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(40))
def test_csr_tables_agree_with_the_block_tables(seed):
    case, _ = random_paged_case(seed, decode_only=seed % 3 == 0, head_dim=8, **SHAPES)
    batch = case.batch
    page_size, seqs = batch.block_size, list(zip(case.context_lens, batch.query_lens_host))
    tables = page_tables(batch.query_start_loc_host, batch.seq_lens_host, host_block_tables(batch), page_size)
    for array in (tables.qo_indptr, tables.paged_kv_indptr, tables.paged_kv_indices, tables.paged_kv_last_page_len):
        assert array.dtype == np.int32 and array.flags.c_contiguous
    assert tables.qo_indptr.tolist() == batch.query_start_loc_host
    assert tables.paged_kv_indptr[0] == 0 and tables.paged_kv_indptr[-1] == len(tables.paged_kv_indices)
    assert ((tables.paged_kv_last_page_len >= 1) & (tables.paged_kv_last_page_len <= page_size)).all()
    assert tables.num_tokens == sum(q for _, q in seqs) and tables.num_seqs == len(seqs)
    for i, seq_len in enumerate(batch.seq_lens_host):
        pages = tables.paged_kv_indices[tables.paged_kv_indptr[i] : tables.paged_kv_indptr[i + 1]].tolist()
        assert pages == case.tables[i], "a request's pages are its blocks, in order, and only those"
        assert (len(pages) - 1) * page_size + tables.paged_kv_last_page_len[i] == seq_len
        # position p lives at pages[p // page_size], offset p % page_size: the slots write_kv used
        reachable = token_slots(pages, 0, seq_len, page_size)
        assert torch.equal(reachable, token_slots(case.tables[i], 0, seq_len, page_size))


def test_tables_narrower_than_a_sequence_are_refused():
    with pytest.raises(ValueError, match="2 columns; a sequence needs 3"):
        page_tables([0, 1], [40], np.array([[3, 4]], dtype=np.int32), 16)


def test_window_left_counts_the_query_itself():
    assert window_left(None) == -1
    assert window_left(1) == 0
    assert window_left(4096) == 4095


# -- the backend end to end, FlashInfer's wrappers standing in as the model above ---------------


class _WrapperModel:
    """What both wrappers share: the float workspace and the NHD layout, and ``run()`` computed by
    :func:`paged_prefill_model` from what the last ``plan()`` was given (host tensors only)."""

    plans: list[tuple[str, dict]] = []

    def __init__(self, float_workspace_buffer, kv_layout="NHD", *args, **kwargs):
        assert kv_layout == "NHD" and float_workspace_buffer.dtype == torch.uint8

    def _plan(self, kind, qo_indptr, indptr, indices, last_page_len, facts):
        for tensor in (qo_indptr, indptr, indices, last_page_len):
            assert tensor.device.type == "cpu" and tensor.dtype == torch.int32, "plan() takes host int32 tensors"
        self.tables = SimpleNamespace(
            qo_indptr=qo_indptr.numpy(), paged_kv_indptr=indptr.numpy(), paged_kv_indices=indices.numpy(),
            paged_kv_last_page_len=last_page_len.numpy(),
        )  # fmt: skip
        self.facts = facts
        _WrapperModel.plans.append((kind, facts))

    def run(self, q, paged_kv_cache, *, k_scale=None, v_scale=None, out=None, lse=None, return_lse=False):
        assert q.is_contiguous() and q.shape[0] == self.tables.qo_indptr[-1]
        facts = self.facts
        window = facts["window_left"]
        return paged_prefill_model(q, paged_kv_cache, self.tables, facts["sm_scale"], window, facts["logits_soft_cap"])


class PrefillWrapperModel(_WrapperModel):
    def plan(
        self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads,
        head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal=False,
        pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None,
        rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None, non_blocking=True,
    ):  # fmt: skip
        """flashinfer-python 0.2.5-0.6's ``BatchPrefillWithPagedKVCacheWrapper.plan`` signature."""
        assert causal and (num_qo_heads, num_kv_heads, head_dim_qk) == (8, 2, 64)
        facts = dict(sm_scale=sm_scale, window_left=window_left, logits_soft_cap=logits_soft_cap, page_size=page_size)
        self._plan("prefill", qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, facts)


class DecodeWrapperModel(_WrapperModel):
    def plan(
        self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
        pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type="float16", kv_data_type=None,
        data_type=None, sm_scale=None, rope_scale=None, rope_theta=None, non_blocking=True,
    ):  # fmt: skip
        """flashinfer-python 0.2.0-0.5 ``BatchDecodeWithPagedKVCacheWrapper.plan`` (0.6: same keywords)."""
        assert (num_qo_heads, num_kv_heads, head_dim) == (8, 2, 64)
        qo_indptr = torch.arange(len(last_page_len) + 1, dtype=torch.int32)
        facts = dict(sm_scale=sm_scale, window_left=window_left, logits_soft_cap=logits_soft_cap, page_size=page_size)
        self._plan("decode", qo_indptr, indptr, indices, last_page_len, facts)


@pytest.mark.parametrize("decode_only", [False, True], ids=["mixed", "decode"])
def test_backend_plans_each_layer_kind_once_and_each_layer_gets_its_own_attention(monkeypatch, decode_only):
    """``build_metadata``, ``write_kv`` and ``forward`` of the real backend, with the ``flashinfer``
    module replaced by wrappers that keep its released ``plan()``/``run()`` signatures and compute
    with the model above: one plan per layer kind per step, the decode wrapper for decode-only
    steps, and each layer's output equal to float64 paged attention with its own facts."""
    from kvserve.interfaces import AttentionSpec, LayerAttentionSpec
    from kvserve_attention_flashinfer.backend import FlashInferBackend

    fake = SimpleNamespace(
        BatchPrefillWithPagedKVCacheWrapper=PrefillWrapperModel, BatchDecodeWithPagedKVCacheWrapper=DecodeWrapperModel
    )
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    monkeypatch.setattr(_WrapperModel, "plans", [])
    local, full = LayerAttentionSpec(0.3, sliding_window=5, logits_soft_cap=1.5), LayerAttentionSpec(0.125)
    layers = (local, full, local)
    spec = AttentionSpec(8, 2, 64, torch.float32, 16, torch.device("cpu"), layers=layers)
    backend = FlashInferBackend(spec)
    seqs = [(40, 1), (20, 1), (7, 1)] if decode_only else [(0, 9), (40, 1), (20, 6), (7, 1)]
    case = make_paged_case(seqs, 8, 2, 64, 16, seed=12)
    caches = backend.allocate_kv_cache(case.num_blocks)
    past_step, past_keys, past_values = past_batch(case)
    past_metadata = backend.build_metadata(past_step)
    _WrapperModel.plans.clear()
    metadata = backend.build_metadata(case.batch)
    kind = "decode" if decode_only else "prefill"
    assert [(k, f["window_left"], f["logits_soft_cap"]) for k, f in _WrapperModel.plans] == [
        (kind, 4, 1.5),
        (kind, -1, None),
    ], "one plan per distinct layer kind, with its window and soft-cap"
    for layer_idx, (cache, layer) in enumerate(zip(caches, layers)):
        backend.write_kv(cache, past_keys, past_values, past_metadata)
        backend.write_kv(cache, case.key, case.value, metadata)
        out = backend.forward(case.query, cache, metadata, layer_idx)
        torch.testing.assert_close(out.double(), layer_reference_attention(case, layer), atol=1e-5, rtol=1e-5)
