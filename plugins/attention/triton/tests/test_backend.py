"""The backend class on the attention interface: per-layer facts from ``spec.layers``, the
declared KV layout, padded slots, the split-KV choice and the refusal reasons."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from triton_cases import DEVICE, MIXED, check, make_case

from kvserve.interfaces import AttentionSpec as Spec
from kvserve.interfaces import LayerAttentionSpec as Layer
from kvserve.testing.attention_reference import build_batch
from kvserve_attention_triton.backend import CPU_HINT, TritonAttentionBackend
from kvserve_platform_cpu.platform import CpuPlatform


def spec(heads=8, kv_heads=2, head_dim=64, dtype=torch.float32, block_size=16, layers=None):
    layers = layers or (Layer(head_dim**-0.5),)
    return Spec(heads, kv_heads, head_dim, dtype, block_size, DEVICE, layers=tuple(layers))


def test_refuses_the_cpu_platform_without_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    reasons = TritonAttentionBackend.unsupported_reasons(spec(), CpuPlatform())
    assert reasons == [f"platform 'cpu': {CPU_HINT}"]


def test_serves_the_cpu_platform_under_the_interpreter_and_names_what_it_refuses(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    platform = CpuPlatform()
    assert TritonAttentionBackend.unsupported_reasons(spec(), platform) == []
    for head_dim in (32, 100, 512):
        assert any(
            f"head size {head_dim}" in r
            for r in TritonAttentionBackend.unsupported_reasons(spec(head_dim=head_dim), platform)
        )
    assert any("float64" in r for r in TritonAttentionBackend.unsupported_reasons(spec(dtype=torch.float64), platform))
    assert any("24" in r for r in TritonAttentionBackend.unsupported_reasons(spec(block_size=24), platform))
    fp8 = dataclasses.replace(spec(), kv_cache_dtype=torch.float8_e4m3fn)
    assert any("float8_e4m3fn" in r for r in TritonAttentionBackend.unsupported_reasons(fp8, platform))


def test_kv_cache_shape_is_the_declared_layout():
    backend = TritonAttentionBackend(spec(heads=6, kv_heads=3, head_dim=80, block_size=32))
    assert backend.kv_cache_shape(7) == (2, 7, 32, 3, 80)
    assert TritonAttentionBackend.kv_cache_layout == "(2, num_blocks, block_size, num_kv_heads, head_dim)"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_layers_use_their_own_scale_window_and_soft_cap(dtype):
    """One metadata serves layers with different facts; q/k/v are strided slices of a fused qkv."""
    layers = (Layer(64**-0.5), Layer(0.2, sliding_window=9), Layer(0.1, logits_soft_cap=3.0), Layer(1.0, 5, 50.0))
    backend = TritonAttentionBackend(spec(dtype=dtype, layers=layers))
    case = make_case(MIXED, 8, 2, 64, 16, dtype, seed=2, qkv=True)
    metadata = backend.build_metadata(case.batch)
    assert metadata.num_segments == 1
    for layer_idx, layer in enumerate(layers):
        out = backend.forward(case.query, case.cache, metadata, layer_idx)
        check(case, out, scale=layer.scale, window=layer.sliding_window, soft_cap=layer.logits_soft_cap)


def test_write_kv_then_forward_with_padded_tokens():
    """Tokens padded behind the batch (slot -1) are not stored; the real ones are, then attended."""
    backend = TritonAttentionBackend(spec(block_size=32))
    case = make_case(MIXED, 8, 2, 64, 32, torch.float32, seed=6)
    tokens = case.batch.num_tokens
    keys = torch.cat([k[-q:] for k, (_, q) in zip(case.keys, MIXED)]).to(DEVICE)
    values = torch.cat([v[-q:] for v, (_, q) in zip(case.values, MIXED)]).to(DEVICE)
    slots = case.batch.slot_mapping
    cache = case.cache.clone()
    cache[:, :, :, :, :].view(2, -1, 2, 64)[:, slots] = 0.0  # forget this step's K/V
    padded = torch.cat([slots, torch.full((3,), -1, dtype=slots.dtype, device=DEVICE)])
    noise = torch.randn(3, 2, 64, device=DEVICE)
    metadata = backend.build_metadata(dataclasses.replace(case.batch, slot_mapping=padded))
    backend.write_kv(cache, torch.cat([keys, noise]), torch.cat([values, noise]), metadata)
    assert torch.equal(cache, case.cache), "write_kv stored something other than the real tokens' K/V"
    out = backend.forward(case.query, cache, metadata, 0)
    check(case, out[:tokens], scale=64**-0.5)


def test_long_decodes_take_the_split_kv_path():
    """A decode-only batch with long sequences and few programs is split into key segments."""

    class EagerSplit(TritonAttentionBackend):
        split_kv_min_seq_len = 100
        split_kv_segment_len = 64

    seqs = [(299, 1), (40, 1), (130, 1)]
    backend = EagerSplit(spec(kv_heads=2, layers=[Layer(0.125, sliding_window=150)]))
    case = make_case(seqs, 8, 2, 64, 16, torch.float32, seed=7)
    metadata = backend.build_metadata(case.batch)
    assert metadata.num_segments == 5  # ceil(300 / 64)
    check(case, backend.forward(case.query, case.cache, metadata, 0), scale=0.125, window=150)
    mixed = backend.build_metadata(build_batch([[1, 2]], [3], [5], 16, DEVICE))
    assert mixed.num_segments == 1, "a batch with a prefill stays on the unified kernel"
