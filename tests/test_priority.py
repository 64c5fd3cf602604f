"""The priority scheduler end to end: admission and preemption victims follow priority, and
every request still finishes with the greedy tokens of an unpressured first-come-first-served run."""

import random

import pytest

from kvserve import LLM, SamplingParams
from kvserve.interfaces import SchedulerOutput
from kvserve.testing.hf_models import TINY_VOCAB, build_tiny_model

NEW_TOKENS = 16
_rng = random.Random(1)
PROMPTS = [[_rng.randrange(3, TINY_VOCAB) for _ in range(12)] for _ in range(6)]
PRIORITIES = [3, 3, 0, 1, 2, 0]
URGENT = PROMPTS[0][::-1]  # arrives later, while the KV cache is full
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_tiny_model("llama", tmp_path_factory.mktemp("priority"))


@pytest.fixture(scope="module")
def expected(model_path):
    reference = LLM(str(model_path), dtype="float32", max_model_len=64, num_kv_blocks=64, scheduler="fifo")
    return [o.outputs[0].token_ids for o in reference.generate([*PROMPTS, URGENT], GREEDY, use_tqdm=False)]


def _pressured_priority_llm(model_path) -> LLM:
    # 6 prompts of 3 blocks fit in 20 blocks; their outputs (8 blocks each) do not.
    return LLM(str(model_path), dtype="float32", max_model_len=64, block_size=4, num_kv_blocks=20, scheduler="priority")


def test_priority_orders_admission_and_victims_and_keeps_greedy_tokens(model_path, expected, monkeypatch):
    llm = _pressured_priority_llm(model_path)
    engine = llm.engine
    plans: list[SchedulerOutput] = []
    schedule = engine.scheduler.schedule
    monkeypatch.setattr(engine.scheduler, "schedule", lambda: plans.append(schedule()) or plans[-1])
    for i, (prompt, priority) in enumerate(zip(PROMPTS, PRIORITIES)):
        engine.add_request(f"r{i}", engine.check_request(prompt, GREEDY, priority=priority))
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        if len(plans) == 3:
            engine.add_request("urgent", engine.check_request(URGENT, GREEDY, priority=-1))
        for output in engine.step():
            if output.finished:
                tokens[output.request_id] = output.outputs[0].token_ids

    assert [tokens[f"r{i}"] for i in range(len(PROMPTS))] + [tokens["urgent"]] == expected
    arrival = plans[3]
    assert "urgent" in [item.request.request_id for item in arrival.scheduled], "admitted as soon as it came"
    assert [victim.priority for victim in arrival.preempted] == [3], "by preempting the least urgent"
    first_admitted = list(dict.fromkeys(item.request.request_id for plan in plans[:3] for item in plan.scheduled))
    assert first_admitted == ["r2", "r5", "r3", "r4", "r0", "r1"], "priority order, ties by arrival"
    victims = [(plan, victim) for plan in plans for victim in plan.preempted]
    assert victims, "the small KV cache should have forced preemption"
    for plan, victim in victims:
        assert all(victim.priority >= item.request.priority for item in plan.scheduled), "a more urgent victim"
    assert {victim.request_id for _, victim in victims}.isdisjoint({"r2", "r5"}), "the most urgent ran through"
    stats = engine.kv_cache_manager.stats()
    assert stats.num_free_blocks == stats.num_blocks, "blocks leaked"


def test_generate_with_priorities_keeps_greedy_tokens(model_path, expected):
    llm = _pressured_priority_llm(model_path)
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False, priority=PRIORITIES)
    assert [o.outputs[0].token_ids for o in outputs] == expected[: len(PROMPTS)]
    assert llm.engine.num_preemptions > 0
