"""Lookahead through core's batching machinery and paged KV manager: a fake proposer drafting 3
tokens a step, verification accepting 0 to 3 of them, leaves outputs, reference counts, block
tables and prefix-cache hashes as decoding one token per step does.

The scheduler contract checks outputs and the interface-level invariants for every scheduler
plugin; here the paged manager's own state is compared: its pool's reference counts after every
``schedule()`` and ``update()``, and its prefix cache, whose every entry must hold known tokens
(never a draft) and the KV the fake model wrote.
"""

from __future__ import annotations

import pytest

from kvserve.config import SchedulerConfig
from kvserve.kv_cache.paged import PagedKVCacheManager
from kvserve.request import Request
from kvserve.sampling_params import SamplingParams
from kvserve.scheduling import BatchingScheduler
from kvserve.testing.scheduler_driver import (
    Arrival,
    SchedulerDriver,
    Workload,
    draft_proposer,
    greedy_token,
    random_workload,
)


class ArrivalOrder(BatchingScheduler):
    name = "arrival_order"

    def admission_key(self, request: Request) -> float:
        return request.arrival_time

    def preemption_victim(self, running: list[Request]) -> Request:
        return running[-1]


class PagedStateDriver(SchedulerDriver):
    """Also checks, after every ``schedule()`` and ``update()``, the paged manager's state: each
    block's reference count is the number of running requests whose table holds it, and each
    prefix-cache entry holds a prefix of some request's known tokens (so no draft) and, once the
    step ran, the KV the fake model wrote into that block."""

    def _check_blocks(self, after: str) -> None:
        super()._check_blocks(after)
        manager: PagedKVCacheManager = self.kv
        holders = [0] * manager.num_blocks
        for request in self.running:
            for block in manager.block_table(request.request_id):
                holders[block] += 1
        if holders != manager.pool.ref_counts:
            wrong = {
                b: (manager.pool.ref_counts[b], n) for b, n in enumerate(holders) if manager.pool.ref_counts[b] != n
            }
            self._fail(f"after {after}: block -> (reference count, running holders) differ: {wrong}")
        known = [r.token_ids(0, r.num_tokens) for r in self.result.requests.values()]
        size = manager.block_size
        for entry in manager.prefix_cache._by_block.values():
            chain, link = [], entry
            while link is not None:
                chain[:0] = link.token_ids
                link = link.parent
            if not any(tokens[: len(chain)] == chain for tokens in known):
                self._fail(f"after {after}: block {entry.block_id} is cached for tokens {chain}, no request's tokens")
            written = [self.kv_content.get(entry.block_id * size + i) for i in range(size)]
            if after != "schedule()" and written != list(entry.token_ids):  # the plan's KV is written after it
                self._fail(
                    f"after {after}: block {entry.block_id} is cached for {entry.token_ids}, its KV is {written}"
                )


def run(workload: Workload, *, drafts_seed: int | None) -> tuple[dict[str, list[int]], PagedKVCacheManager, int]:
    """Outputs, the manager at the end, and the drafts accepted."""
    manager = PagedKVCacheManager(workload.usable_blocks + 1, workload.block_size, workload.enable_prefix_caching)
    config = SchedulerConfig(
        max_num_seqs=workload.max_num_seqs,
        max_num_batched_tokens=workload.max_num_batched_tokens,
        enable_chunked_prefill=workload.enable_chunked_prefill,
    )
    scheduler = ArrivalOrder(config, manager, workload.max_model_len)
    proposer = None if drafts_seed is None else draft_proposer(workload.vocab, drafts_seed)
    driver = PagedStateDriver(scheduler, vocab=workload.vocab, proposer=proposer)
    result = driver.run(workload.arrivals)
    return result.outputs, manager, result.drafts_accepted


@pytest.mark.parametrize("seed", range(8))
def test_drafts_leave_prefix_cache_and_outputs_as_one_token_per_step(seed):
    """A roomy cache with prefix caching (nothing evicted): after the run the prefix cache holds
    exactly the hashes decoding one token per step leaves, every block is free, outputs agree."""
    workload = random_workload(seed, tiny_cache=False, aborts=0).with_(enable_prefix_caching=True)
    plain, plain_manager, _ = run(workload, drafts_seed=None)
    drafted, manager, accepted = run(workload, drafts_seed=seed)
    assert accepted and drafted == plain
    assert set(manager.prefix_cache._by_hash) == set(plain_manager.prefix_cache._by_hash)
    assert manager.pool.ref_counts == plain_manager.pool.ref_counts == [0] * manager.num_blocks


@pytest.mark.parametrize("seed", range(8))
def test_drafts_under_preemption_keep_the_paged_state_exact(seed):
    """A cache so small that requests are preempted, prefix caching on: reference counts and the
    prefix cache stay exact at every step (the driver), outputs agree with one token per step."""
    workload = random_workload(seed, aborts=0).with_(enable_prefix_caching=True)
    plain, _, _ = run(workload, drafts_seed=None)
    drafted, _, accepted = run(workload, drafts_seed=seed)
    assert accepted and drafted == plain


def continuation(prompt: list[int], length: int, vocab: int) -> list[int]:
    """The fake model's greedy continuation of ``prompt``."""
    tokens = list(prompt)
    for _ in range(length):
        tokens.append(greedy_token(tokens, vocab))
    return tokens[len(prompt) :]


@pytest.mark.parametrize("stop", ["stop_token", "max_tokens"])
def test_a_stop_inside_the_drafts_ends_the_request_there(stop):
    """Always-right drafts, the stop falling on the second draft of the first decode: the request
    ends with it, nothing after it appended (a stop token), or the drafts are cut so that none
    lies past ``max_tokens``."""
    workload = random_workload(0, tiny_cache=False, aborts=0)
    prompt = next(p for p in ([3, 4, i] for i in range(3, 32)) if len(set(continuation(p, 4, workload.vocab))) == 4)
    c = continuation(prompt, 4, workload.vocab)  # c[0] sampled after the prompt, c[1..3] drafted after it
    if stop == "stop_token":
        params = SamplingParams(max_tokens=20, stop_token_ids=[c[2]], ignore_eos=True)
    else:
        params = SamplingParams(max_tokens=3, ignore_eos=True)
    manager = PagedKVCacheManager(workload.usable_blocks + 1, workload.block_size, True)
    scheduler = ArrivalOrder(SchedulerConfig(max_num_batched_tokens=64), manager, workload.max_model_len)
    driver = PagedStateDriver(
        scheduler, vocab=workload.vocab, proposer=draft_proposer(workload.vocab, 0, always_right=True)
    )
    driver.add(Arrival(0, "r", prompt, params))
    driver.step()  # the prompt: samples c[0]
    plan = driver.step()  # c[0] and its drafts
    assert [item.draft_token_ids for item in plan.scheduled] == [[c[1], c[2], c[3]] if stop == "stop_token" else [c[1]]]
    assert driver.result.outputs == {"r": c[:3]} and not scheduler.has_unfinished()
    assert manager.pool.num_free() == workload.usable_blocks
