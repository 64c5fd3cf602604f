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

from kvserve import LLM
from kvserve.testing.hf_models import build_lora_adapter, build_tiny_model
from kvserve.testing.lora_parity import assert_rows_match, generate_mixed, peft_rows
from kvserve.testing.quant_parity import LORA_ADAPTERS

NEW_TOKENS = 8
PROMPTS = ["The quick brown fox", "Paris is the capital of", "Paged attention stores keys and values in blocks"]
# name -> LoraConfig fields: o_proj and down_proj are row-parallel, the rest column-parallel
ADAPTERS = {**LORA_ADAPTERS, "o-down-r16": {"r": 16, "lora_alpha": 8, "target_modules": ["o_proj", "down_proj"]}}
ENGINE = {"dtype": "float32", "max_model_len": 128, "num_kv_blocks": 64, "enable_lora": True, "max_lora_rank": 16}


def _generate(base, adapters, prompt_ids, **engine):
    """Every (adapter or None, prompt) row, all in one generate call of an engine with two slots."""
    llm = LLM(str(base), max_loras=2, **ENGINE, **engine)
    try:
        return generate_mixed(llm, prompt_ids, adapters, NEW_TOKENS)
    finally:
        llm.engine.shutdown()


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
    two = _generate(base, adapters, prompt_ids, tensor_parallel_size=2, distributed_executor_backend=executor)
    assert_rows_match(two, peft_rows(base, prompt_ids, adapters, NEW_TOKENS))
    one = _generate(base, adapters, prompt_ids)
    assert_rows_match(two, one, against="one rank")
