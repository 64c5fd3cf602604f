"""Greedy fp32 tokens identical to HF transformers ``generate`` for every Llama-family architecture."""

import pytest
import torch
import transformers

from kvserve import LLM, SamplingParams
from kvserve.testing.hf_models import build_tiny_model

PROMPTS = [
    "Paris is the capital of",
    "The quick brown fox jumps over the lazy dog. Continuous batching admits new requests",
    "0123456789",
    "Paged attention stores keys and values in fixed size blocks, while others are still decoding.",
    "abc",
]
NEW_TOKENS = 24

VARIANTS = {
    "llama-gqa": ("llama", {}),
    "llama-mha-tied": ("llama", {"num_key_value_heads": 4, "tie_word_embeddings": True}),
    "mistral": ("mistral", {}),
    "qwen2-tied": ("qwen2", {"tie_word_embeddings": True}),
    "qwen3": ("qwen3", {"num_key_value_heads": 1}),
    # Windows shorter than most prompts, 24 tokens generated past them: every layer slides...
    "mistral-window": ("mistral", {"sliding_window": 6}),
    # ...or, as Qwen2 does from max_window_layers on, only the later layers (layer 0 sees everything).
    "qwen2-window": ("qwen2", {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1}),
}


def hf_greedy(path, prompt_ids, max_new_tokens):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    outputs = []
    for ids in prompt_ids:
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=max_new_tokens)
        outputs.append(out[0, len(ids) :].tolist())
    return outputs


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def tiny_model(request, tmp_path_factory):
    arch, overrides = VARIANTS[request.param]
    path = build_tiny_model(arch, tmp_path_factory.mktemp(request.param), **overrides)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
    return path, prompt_ids, hf_greedy(path, prompt_ids, NEW_TOKENS)


GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS)


def _tokens(llm, prompt_ids):
    return [o.outputs[0].token_ids for o in llm.generate(prompt_ids, GREEDY, use_tqdm=False)]


def test_batched_greedy_matches_hf(tiny_model):
    path, prompt_ids, expected = tiny_model
    assert _tokens(LLM(str(path), max_model_len=128, num_kv_blocks=64), prompt_ids) == expected


def test_chunked_prefill_matches_hf(tiny_model):
    path, prompt_ids, expected = tiny_model
    llm = LLM(str(path), max_model_len=128, num_kv_blocks=64, max_num_batched_tokens=7)
    assert _tokens(llm, prompt_ids) == expected


def test_preemption_matches_hf(tiny_model):
    path, prompt_ids, expected = tiny_model
    llm = LLM(str(path), max_model_len=72, block_size=4, num_kv_blocks=18)
    assert _tokens(llm, prompt_ids) == expected
    assert llm.engine.num_preemptions > 0, "the tiny KV cache should have forced preemption"
    assert llm.engine.kv_cache_manager.num_free_blocks() == 18
