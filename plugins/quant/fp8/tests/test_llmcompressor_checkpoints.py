"""Checkpoints llmcompressor itself wrote (``oneshot`` on CPU, see fixtures/make_llmcompressor_fixtures.py):
kvserve matches HF transformers decompressing them to fp32, and keeps their size in memory; two
tensor-parallel ranks give the tokens of one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import transformers

from kvserve import LLM
from kvserve.testing.hf_models import build_tokenizer
from kvserve.testing.parallel import greedy_tokens
from kvserve.testing.quant_parity import PROMPTS, assert_matches_reference, hf_greedy, kvserve_greedy, linear_bytes

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("name", ["llmcompressor-fp8-dynamic", "llmcompressor-fp8"])
def test_llmcompressor_checkpoint_matches_hf(tmp_path, name):
    pytest.importorskip("compressed_tensors", reason="transformers decompresses the reference with compressed-tensors")
    path = tmp_path / name
    shutil.copytree(FIXTURES / name, path)
    tokenizer = build_tokenizer(path)
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, quantization_config=transformers.CompressedTensorsConfig(run_compressed=False)
    ).eval()
    llm = LLM(str(path), dtype="float32", max_model_len=128, num_kv_blocks=64)
    lengths = assert_matches_reference(kvserve_greedy(llm, prompt_ids), hf_greedy(reference, prompt_ids))
    print(f"{name}: matching greedy tokens per prompt {lengths} of 32")
    assert llm.engine.model.model.layers[1].mlp.gate_proj.weight.dtype == torch.float8_e4m3fn
    resident, stored = linear_bytes(llm.engine.model, path)
    assert abs(resident / stored - 1) <= 0.1, f"resident linear bytes {resident} vs checkpoint {stored}"


@pytest.mark.parametrize("name", ["llmcompressor-fp8-dynamic", "llmcompressor-fp8"])
def test_llmcompressor_checkpoint_on_two_tensor_parallel_ranks_matches_one(tmp_path, name):
    """Row-parallel layers take their rank's input columns of the FP8 weight and keep its scales
    whole (per-channel ``[out, 1]`` in FP8_DYNAMIC, per-tensor weight and static input scales in
    FP8); column layers slice per-channel scales with their rows."""
    path = tmp_path / name
    shutil.copytree(FIXTURES / name, path)
    tokenizer = build_tokenizer(path)
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
    assert greedy_tokens(path, prompt_ids, tensor_parallel_size=2) == greedy_tokens(path, prompt_ids)
