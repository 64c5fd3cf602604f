"""Core's reference LayerOps compute what HF transformers' modules compute, bit for bit, and
use_layer_ops hands a model's layers the platform's ops."""

from __future__ import annotations

import pytest
import torch
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from kvserve.layers import RMSNorm, RotaryEmbedding, SiluAndMul, TorchLayerOps, use_layer_ops

ops = TorchLayerOps()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_is_hf_llama_and_gemma(dtype):
    gen = torch.Generator().manual_seed(0)
    x, residual = (torch.randn(6, 40, generator=gen).to(dtype) for _ in range(2))
    llama, gemma = LlamaRMSNorm(40, eps=1e-5).to(dtype), Gemma3RMSNorm(40, eps=1e-6).to(dtype)
    with torch.no_grad():
        llama.weight.copy_(torch.randn(40, generator=gen))
        gemma.weight.copy_(torch.randn(40, generator=gen))
        assert torch.equal(ops.rms_norm(x, llama.weight, 1e-5, 0.0), llama(x))
        assert torch.equal(ops.rms_norm(x, gemma.weight, 1e-6, 1.0), gemma(x))
        # The fused residual: HF's `residual + hidden`, then the norm of that sum.
        normed, summed = ops.fused_add_rms_norm(x, residual, gemma.weight, 1e-6, 1.0)
        assert torch.equal(summed, residual + x) and torch.equal(normed, gemma(residual + x))


def test_rotary_is_hf_neox_rotation():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(5, 4, 16, generator=gen), torch.randn(5, 2, 16, generator=gen)
    angles = torch.outer(torch.arange(50.0), torch.rand(8, generator=gen))
    positions = torch.tensor([0, 3, 49, 7, 7])
    got_q, got_k = ops.rotary_embedding(positions, q, k, angles.cos(), angles.sin())
    full = torch.cat([angles, angles], dim=-1)[positions]  # HF's [tokens, head_dim] tables
    hf_q, hf_k = apply_rotary_pos_emb(q, k, full.cos(), full.sin())  # heads on dimension 1
    assert torch.equal(got_q, hf_q) and torch.equal(got_k, hf_k)


class RecordingOps(TorchLayerOps):
    """Core's ops, counting the calls each layer makes."""

    name = "recording"

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def rms_norm(self, *args):
        self.calls.append("rms_norm")
        return super().rms_norm(*args)

    def silu_and_mul(self, *args):
        self.calls.append("silu_and_mul")
        return super().silu_and_mul(*args)


def test_use_layer_ops_reaches_every_layer():
    model = torch.nn.ModuleDict({"norm": RMSNorm(8, 1e-6), "act": SiluAndMul(), "linear": torch.nn.Linear(8, 8)})
    model["rope"] = RotaryEmbedding(type("Config", (), {"rope_theta": 10000.0})(), 8, 16)
    recording = RecordingOps()
    assert use_layer_ops(model, recording) == 3
    assert all(model[name].ops is recording for name in ("norm", "act", "rope"))
    x = torch.randn(2, 8)
    model["norm"](x)
    model["act"](x, x)
    assert recording.calls == ["rms_norm", "silu_and_mul"] and recording.describe() == "recording"
    assert TorchLayerOps(reason="no compiler").describe() == "torch (no compiler)"
