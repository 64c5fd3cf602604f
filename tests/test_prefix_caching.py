"""Prefix caching end to end: the same greedy tokens with it on and off, batched, chunked,
preempted and with n > 1; exact hit counts; forced hash collisions never reuse wrong KV."""

import random

import pytest

from kvserve import LLM, SamplingParams
from kvserve.config import SchedulerConfig
from kvserve.kv_cache.paged import PagedKVCacheManager
from kvserve.request import Request
from kvserve.testing.hf_models import TINY_VOCAB, build_tiny_model
from kvserve_scheduler_fifo.scheduler import FifoScheduler

NEW_TOKENS = 12
_rng = random.Random(0)
PREFIX = [_rng.randrange(3, TINY_VOCAB) for _ in range(37)]  # a long shared "system prompt", not block aligned
PROMPTS = [
    PREFIX + [5, 6, 7],
    PREFIX + [8, 9, 10, 11, 12, 13],
    PREFIX,
    PREFIX + [5, 6, 7],  # a repeat
    PREFIX[:20] + [_rng.randrange(3, TINY_VOCAB) for _ in range(22)],  # diverges inside the second block
    [_rng.randrange(3, TINY_VOCAB) for _ in range(40)],  # shares nothing
]
CONFIGS = {
    "batched": dict(num_kv_blocks=64),
    "chunked": dict(num_kv_blocks=64, max_num_batched_tokens=11),
    "preempted": dict(block_size=4, num_kv_blocks=24),  # a few prompts fit, not their outputs
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The model and its greedy tokens from a plain run (no caching, no pressure; HF parity is
    tests/test_hf_parity.py's business)."""
    path = build_tiny_model("llama", tmp_path_factory.mktemp("prefix"))
    reference = LLM(str(path), dtype="float32", max_model_len=64, num_kv_blocks=64, enable_prefix_caching=False)
    return path, [completions[0] for completions in _generate(reference, PROMPTS)]


def _generate(llm: LLM, prompts: list[list[int]], n: int = 1) -> list[list[list[int]]]:
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, n=n)
    return [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params, use_tqdm=False)]


def _assert_no_leaks(llm: LLM) -> None:
    stats = llm.engine.kv_cache_manager.stats()
    assert stats.num_free_blocks == stats.num_blocks, "blocks leaked"


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_greedy_tokens_same_with_prefix_caching_on_and_off(tiny, config):
    path, expected = tiny
    for caching in (False, True):
        llm = LLM(str(path), dtype="float32", max_model_len=64, enable_prefix_caching=caching, **CONFIGS[config])
        # Two batches: the second also reuses what the first left cached.
        got = _generate(llm, PROMPTS[:3]) + _generate(llm, PROMPTS)
        assert got == [[tokens] for tokens in expected[:3] + expected], f"prefix caching {'on' if caching else 'off'}"
        assert (llm.engine.kv_cache_manager.stats().prefix_hits > 0) == caching
        if config == "preempted":
            assert llm.engine.num_preemptions > 0, "the tiny KV cache should have forced preemption"
        _assert_no_leaks(llm)


def test_n_greater_than_one_shares_the_prompt_and_keeps_greedy_tokens(tiny):
    path, expected = tiny
    llm = LLM(str(path), dtype="float32", max_model_len=64, **CONFIGS["preempted"])
    assert _generate(llm, PROMPTS[:2], n=3) == [[tokens] * 3 for tokens in expected[:2]]
    _assert_no_leaks(llm)


def test_hit_accounting_is_exact(tiny):
    path, _ = tiny
    llm = LLM(str(path), dtype="float32", max_model_len=64, block_size=16, num_kv_blocks=64)
    _generate(llm, [PROMPTS[0]])
    stats = llm.engine.kv_cache_manager.stats()
    assert (stats.prefix_queries, stats.prefix_hits) == (40, 0)
    _generate(llm, [PROMPTS[1], PROMPTS[2], PROMPTS[4]])
    stats = llm.engine.kv_cache_manager.stats()
    # 32 (two full blocks of PREFIX) + 32 (PREFIX alone: its last token recomputed) + 16 (first block only)
    assert (stats.prefix_queries, stats.prefix_hits) == (40 + 43 + 37 + 42, 32 + 32 + 16)
    assert llm.engine.stats().kv_cache.prefix_hit_rate == pytest.approx(80 / 162)
    assert llm.engine.reset_prefix_cache()
    _generate(llm, [PROMPTS[0]])
    assert llm.engine.kv_cache_manager.stats().prefix_hits == 80, "nothing is cached after a reset"


def test_forced_hash_collisions_never_reuse_wrong_kv(tiny):
    path, expected = tiny
    llm = LLM(str(path), dtype="float32", max_model_len=64, block_size=4, num_kv_blocks=64)
    # Blocks at the same position all collide, whatever their tokens: only verification keeps KV right.
    llm.engine.kv_cache_manager.prefix_cache.hash_fn = lambda parent, tokens, extra: hash(parent)
    got = _generate(llm, PROMPTS[:3]) + _generate(llm, PROMPTS[3:])
    assert got == [[tokens] for tokens in expected]
    assert llm.engine.kv_cache_manager.stats().prefix_hits > 0
    _assert_no_leaks(llm)


def test_a_prefix_is_reused_in_the_step_that_computes_it():
    # The runner writes every scheduled token's KV of a layer before that layer's attention
    # reads it, so b can attend to the blocks a fills in the same forward pass.
    kv_cache = PagedKVCacheManager(32, 4, enable_prefix_caching=True)
    scheduler = FifoScheduler(SchedulerConfig(), kv_cache, max_model_len=64)
    for rid in ("a", "b"):
        scheduler.add_request(Request(rid, list(range(9)), SamplingParams()))
    out = scheduler.schedule()
    assert [(item.start, item.num_tokens) for item in out.scheduled] == [(0, 9), (8, 1)]
    assert kv_cache.block_table("b")[:2] == kv_cache.block_table("a")[:2]
