"""Gemma 3 over two tensor-parallel gloo ranks: greedy fp32 tokens identical to one device and to
HF transformers, on a tiny model with local (window 5) and global layers, q/k norms, a tied
embedding whose 330-id vocabulary leaves padding in rank 1's shard, and chunked prefills."""

from __future__ import annotations

import torch
import transformers

from kvserve.testing.hf_models import build_tiny_model
from kvserve.testing.parallel import greedy_tokens

PROMPTS = ["Paris is the capital of", "The quick brown fox jumps over the lazy dog. Continuous batching", "abc"]
NEW_TOKENS = 12


def test_gemma3_two_ranks_match_one_device_and_hf(tmp_path):
    path = build_tiny_model(
        "Gemma3ForCausalLM", tmp_path / "gemma3", randomize_vectors=True, vocab_size=330, num_hidden_layers=3,
        head_dim=32, sliding_window_pattern=3, sliding_window=5, query_pre_attn_scalar=24,
    )  # fmt: skip
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        expected = [
            hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=NEW_TOKENS)[0, len(ids) :].tolist()
            for ids in prompt_ids
        ]
    assert greedy_tokens(path, prompt_ids, NEW_TOKENS) == expected
    assert greedy_tokens(path, prompt_ids, NEW_TOKENS, tensor_parallel_size=2, max_num_batched_tokens=8) == expected
