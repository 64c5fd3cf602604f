"""``max_decode_slowdown`` through the engine: the steps it times reach the scheduler, a prompt that
arrives while others decode is chunked by time, greedy tokens stay those of an unlimited run, and
the limit is on by default where the engine serves streams."""

from __future__ import annotations

import pytest

from kvserve import LLM, SamplingParams
from kvserve.config import SERVING_MAX_DECODE_SLOWDOWN, EngineConfig
from kvserve.frontend.async_llm import AsyncLLM
from kvserve.scheduling.prefill_time_budget import split_tokens
from kvserve.testing.hf_models import build_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model("llama", tmp_path_factory.mktemp("prefill_time"))


def run(model_dir, **fields) -> tuple[dict[str, list[int]], list[tuple[int, int]], LLM]:
    """Four requests decode; after two steps a 100-token prompt arrives. Returns every request's
    tokens, each step's (decodes, prefill tokens), and the LLM."""
    llm = LLM(str(model_dir), max_model_len=256, num_kv_blocks=64, block_size=16, dtype="float32", **fields)
    engine, plans = llm.engine, []
    schedule = engine.scheduler.schedule

    def recording_schedule():
        plans.append(schedule())
        return plans[-1]

    engine.scheduler.schedule = recording_schedule
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for i in range(4):
        engine.add_request(f"decode{i}", engine.check_request([5 + i] * (6 + i), params))
    tokens = {}
    while engine.has_unfinished_requests():
        if len(plans) == 2:
            engine.add_request("long", engine.check_request([(7 * j) % 300 + 3 for j in range(100)], params))
        for output in engine.step():
            tokens[output.request_id] = output.outputs[0].token_ids
    return tokens, [split_tokens(plan) for plan in plans], llm


def test_a_prompt_among_decodes_is_chunked_by_time_with_the_same_greedy_tokens(model_dir):
    unlimited, unlimited_steps, _ = run(model_dir)
    limited, steps, llm = run(model_dir, max_decode_slowdown=1.5)
    assert limited == unlimited
    assert (4, 100) in unlimited_steps, f"without the limit the prompt runs whole beside the decodes: {unlimited_steps}"
    chunks = [prefill for decodes, prefill in steps if decodes and prefill]
    assert sum(chunks) == 100 and len(chunks) > 1, f"chunks {chunks}: the prompt is split while others decode"
    budget = llm.engine.scheduler.prefill_time_budget
    assert budget.prefill_only_token_seconds > 0, "the first step (prompts only) gives the first guess"
    assert budget.decode_step_seconds(4) > 0, "the engine reports step times"


def test_an_engine_that_serves_streams_limits_prefill_by_default_an_offline_one_does_not(model_dir):
    """``auto``: AsyncLLM (``kvserve serve``) keeps steps that decode within 2x a decode-only one;
    ``LLM``, where nobody watches a stream, keeps the whole token budget for throughput."""
    fields = {"model": str(model_dir), "max_model_len": 256, "num_kv_blocks": 64, "dtype": "float32"}
    offline = LLM(**fields)
    assert offline.engine.scheduler.prefill_time_budget is None
    offline.engine.shutdown()
    served = AsyncLLM.from_config(EngineConfig.from_flat(**fields))
    try:
        assert served.engine.scheduler.prefill_time_budget.max_slowdown == SERVING_MAX_DECODE_SLOWDOWN
    finally:
        served.shutdown()
    chosen = AsyncLLM.from_config(EngineConfig.from_flat(**fields, max_decode_slowdown=0))
    try:
        assert chosen.engine.scheduler.prefill_time_budget is None
    finally:
        chosen.shutdown()
