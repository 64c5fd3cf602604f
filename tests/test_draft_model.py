"""The ``draft_model`` proposer: a second model with its own paged KV cache drafts greedily.

A layer-skip draft (the first layer of a tiny Llama, written as its own checkpoint) gives greedy
fp32 outputs identical to speculation off, batched, with chunked prefill and with preemption; the
target itself as its draft has every draft accepted (its draft KV follows the accepted tokens
exactly); with LoRA on, the draft runs without LoRA slots and requests of adapters get exactly their
outputs without speculation; a draft of another vocabulary is refused at start naming both models;
and the proposer contract, the contract's tiny model drafting for itself.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kvserve import LLM, SamplingParams
from kvserve.errors import ConfigError
from kvserve.layers import LinearBase
from kvserve.lora import LoRARequest
from kvserve.testing import DraftModelContract
from kvserve.testing.hf_models import build_lora_adapter, build_tiny_model, layer_skip_draft


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("draft-model")
    target = build_tiny_model("llama", root / "target", num_hidden_layers=3)
    return str(target), str(layer_skip_draft(target, root / "draft", 1))


def prompts(count: int) -> list[list[int]]:
    rng = random.Random(count)
    return [[rng.randrange(3, 384) for _ in range(3 + i % 9)] * (1 + i % 2) for i in range(count)]


TINY = {"dtype": "float32", "max_model_len": 64, "num_kv_blocks": 128}
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


def tokens_of(llm: LLM, batch, params=GREEDY, **generate) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(batch, params, use_tqdm=False, **generate)]


def test_a_draft_model_runs_without_lora_beside_adapters(models, tmp_path):
    """The draft proposes as the base model (no slots, no adapter); the target verifies with each
    request's adapter, so adapter and base requests get exactly their outputs without speculation."""
    target, draft = models
    adapter = build_lora_adapter(
        Path(target), tmp_path / "qv", 1, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]
    )
    lora = LoRARequest("qv", 1, str(adapter))
    fields = {**TINY, "enable_lora": True, "max_loras": 1}
    spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": 3}
    plain, speculative = LLM(target, **fields), LLM(target, **fields, speculative_config=spec)
    batch = prompts(4)
    requests = [lora, None, lora, None]
    assert tokens_of(speculative, batch, lora_request=requests) == tokens_of(plain, batch, lora_request=requests)
    assert tokens_of(plain, batch, lora_request=requests) != tokens_of(plain, batch), "the adapter changes outputs"
    runner = speculative.engine.speculator.proposer.runner
    assert runner.lora is None and runner.info.lora_kernel is None
    assert all(m.lora is None for m in runner.model.modules() if isinstance(m, LinearBase)), "draft has LoRA slots"


@pytest.mark.parametrize(
    "engine_fields",
    [{}, {"max_num_batched_tokens": 9}, {"block_size": 4, "num_kv_blocks": 40, "max_model_len": 48}],
    ids=["batched", "chunked-prefill", "preemption"],
)
def test_a_layer_skip_draft_gives_exactly_the_outputs_without_speculation(models, engine_fields):
    target, draft = models
    fields = {**TINY, **engine_fields}
    spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": 3}
    plain, speculative = LLM(target, **fields), LLM(target, **fields, speculative_config=spec)
    for size in (1, 8):
        assert tokens_of(speculative, prompts(size)) == tokens_of(plain, prompts(size)), f"batch of {size}"
    stats = speculative.engine.speculator.stats
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens > 0
    if "block_size" in engine_fields:
        assert speculative.engine.num_preemptions > 0, "the small KV cache should have forced preemption"


def test_the_target_as_its_own_draft_has_every_draft_accepted(models):
    target, _ = models
    spec = {"method": "draft_model", "model": target, "num_speculative_tokens": 4}
    llm = LLM(target, **TINY, speculative_config=spec)
    assert tokens_of(llm, prompts(6)) == tokens_of(LLM(target, **TINY), prompts(6))
    stats = llm.engine.speculator.stats
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens == stats.num_draft_tokens


def test_a_draft_of_another_vocabulary_is_refused_naming_both(models, tmp_path):
    target, _ = models
    other = build_tiny_model("llama", tmp_path / "other", vocab_size=300)
    spec = {"method": "draft_model", "model": str(other), "num_speculative_tokens": 3}
    with pytest.raises(ConfigError, match=r"other has a vocabulary of 300 tokens, the target .*target one of 384"):
        LLM(target, **TINY, speculative_config=spec)
    with pytest.raises(ConfigError, match=r"speculative_config\.model: Field required"):
        LLM(target, **TINY, speculative_config={"method": "draft_model", "num_speculative_tokens": 3})


class TestDraftModelContract(DraftModelContract):
    proposer = "draft_model"
