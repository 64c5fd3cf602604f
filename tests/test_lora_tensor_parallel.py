"""Multi-LoRA under tensor parallelism: two gloo ranks (worker processes, or Ray actors), adapters
made with the real ``peft`` mixed in one batch with the base model, against ``PeftModel`` under HF
``generate`` and against one rank.

Each rank's slots hold its shard of every adapter (column layers: ``B``'s output features, row
layers: ``A``'s input features), loaded from what the step carries; ``max_loras=2`` for three
adapters makes them take turns, so slots are refilled between steps on both ranks alike. KV heads
are split over the ranks (2 of them) or replicated on both (1), which cuts ``B`` of k/v differently.
``min_tokens`` masks EOS as the reference's ``min_new_tokens`` does (a random adapter may favour it).
"""

from __future__ import annotations

import pytest
import transformers

from kvserve import LLM, SamplingParams
from kvserve.lora import LoRARequest
from kvserve.testing.hf_models import build_lora_adapter, build_tiny_model, hf_greedy
from kvserve.testing.quant_parity import LORA_ADAPTERS

NEW_TOKENS = 8
PROMPTS = ["The quick brown fox", "Paris is the capital of", "Paged attention stores keys and values in blocks"]
# name -> LoraConfig fields: o_proj and down_proj are row-parallel, the rest column-parallel
ADAPTERS = {**LORA_ADAPTERS, "o-down-r16": {"r": 16, "lora_alpha": 8, "target_modules": ["o_proj", "down_proj"]}}
ENGINE = {"dtype": "float32", "max_model_len": 128, "num_kv_blocks": 64, "enable_lora": True, "max_lora_rank": 16}


def _generate(base, adapters, prompt_ids, **engine):
    """Greedy tokens and their logprobs of every (adapter or None, prompt), all in one generate call."""
    requests = {name: LoRARequest(name, i + 1, str(path)) for i, (name, path) in enumerate(adapters.items())}
    jobs = [(name, i) for i in range(len(prompt_ids)) for name in [None, *adapters]]
    llm = LLM(str(base), max_loras=2, **ENGINE, **engine)
    try:
        outputs = llm.generate(
            [prompt_ids[i] for _, i in jobs],
            SamplingParams(temperature=0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, logprobs=0),
            use_tqdm=False,
            lora_request=[None if name is None else requests[name] for name, _ in jobs],
        )
    finally:
        llm.engine.shutdown()
    results = {}
    for job, output in zip(jobs, outputs):
        got = output.outputs[0]
        results[job] = (got.token_ids, [entry[t].logprob for entry, t in zip(got.logprobs, got.token_ids)])
    return results


@pytest.mark.parametrize(
    ("kv_heads", "executor"),
    [(2, "mp"), (1, "mp"), (2, "ray")],
    ids=["kv-split", "kv-replicated", "kv-split-ray"],
)
def test_two_ranks_match_peft_and_one_rank(tmp_path, kv_heads, executor):
    if executor == "ray":
        pytest.importorskip("ray", reason="ray is not installed (pip install 'kvserve-core[ray]')")
    base = build_tiny_model("llama", tmp_path / "base", randomize_vectors=True, num_key_value_heads=kv_heads)
    tokenizer = transformers.AutoTokenizer.from_pretrained(base)
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
    adapters = {
        name: build_lora_adapter(base, tmp_path / name, seed, **fields)
        for seed, (name, fields) in enumerate(ADAPTERS.items())
    }
    reference = {name: hf_greedy(base, prompt_ids, NEW_TOKENS, adapters.get(name)) for name in [None, *adapters]}
    two = _generate(base, adapters, prompt_ids, tensor_parallel_size=2, distributed_executor_backend=executor)
    one = _generate(base, adapters, prompt_ids)
    for (name, i), (tokens, logprobs) in two.items():
        ref_tokens, ref_logprobs = reference[name][i]
        assert tokens == ref_tokens, f"adapter {name}, prompt {i}: TP=2 differs from PeftModel"
        assert logprobs == pytest.approx(ref_logprobs, abs=1e-3), f"adapter {name}, prompt {i}"
        assert tokens == one[name, i][0], f"adapter {name}, prompt {i}: TP=2 differs from TP=1"
    for name in adapters:  # the adapters change the model: the test compares something
        assert any(reference[name][i][0] != reference[None][i][0] for i in range(len(prompt_ids))), name
