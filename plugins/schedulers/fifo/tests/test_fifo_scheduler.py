import random

import pytest

from kvserve.config import SchedulerConfig
from kvserve.kv_cache.paged import PagedKVCacheManager
from kvserve.request import Request, RequestStatus
from kvserve.sampling_params import SamplingParams
from kvserve_scheduler_fifo.scheduler import FifoScheduler


def run_to_completion(scheduler, requests, abort_ids=(), vocab=50, seed=0):
    """Drive the scheduler like the engine does, with random sampled tokens; check invariants each step."""
    rng = random.Random(seed)
    config = scheduler.config
    for r in requests:
        scheduler.add_request(r)
    admitted, finished, steps, preemptions = [], [], 0, 0
    while scheduler.has_unfinished():
        out = scheduler.schedule()
        steps += 1
        assert steps < 10_000, "scheduler made no progress"
        assert out.num_batched_tokens <= config.max_num_batched_tokens
        assert len(out.scheduled) <= config.max_num_seqs
        preemptions += len(out.preempted)
        for item in out.scheduled:
            table = scheduler.kv_cache.block_table(item.request.request_id)
            assert len(table) * scheduler.kv_cache.block_size >= item.start + item.num_tokens
            if item.start == 0 and item.request.request_id not in admitted:
                admitted.append(item.request.request_id)
        finished += scheduler.update(out, [rng.randrange(vocab) for _ in out.scheduled])
        for rid in abort_ids:
            if steps == 3:
                scheduler.abort_request(rid)
    return admitted, finished, preemptions


def make_scheduler(num_blocks=64, block_size=4, **cfg):
    config = SchedulerConfig(**cfg)
    return FifoScheduler(config, PagedKVCacheManager(num_blocks, block_size), max_model_len=64)


@pytest.mark.parametrize("seed", range(5))
def test_random_workload_invariants_and_no_leaks(seed):
    rng = random.Random(seed)
    scheduler = make_scheduler(num_blocks=20, max_num_batched_tokens=16, max_num_seqs=4)
    requests = [
        Request(f"r{i}", [1] * rng.randint(1, 30), SamplingParams(max_tokens=rng.randint(1, 20), ignore_eos=True))
        for i in range(12)
    ]
    admitted, finished, preemptions = run_to_completion(scheduler, requests, abort_ids=["r5"], seed=seed)
    assert {r.request_id for r in finished} == {f"r{i}" for i in range(12)} - {"r5"}
    for r in finished:
        assert r.status is RequestStatus.FINISHED_LENGTH
        assert len(r.output_token_ids) == r.sampling_params.max_tokens
    assert requests[5].status is RequestStatus.FINISHED_ABORTED
    assert scheduler.kv_cache.num_free_blocks() == 19, "blocks leaked"
    assert admitted == sorted(admitted, key=lambda rid: int(rid[1:])), "FIFO admission order violated"


def test_tiny_cache_forces_preemption_of_latest_request_and_all_finish():
    scheduler = make_scheduler(num_blocks=9, block_size=4, max_num_batched_tokens=64, max_num_seqs=8)
    requests = [Request(f"r{i}", [1] * 10, SamplingParams(max_tokens=20, ignore_eos=True)) for i in range(3)]
    _, finished, preemptions = run_to_completion(scheduler, requests)
    assert preemptions > 0
    assert requests[0].num_preemptions == 0, "FIFO must preempt the latest admitted request first"
    assert len(finished) == 3 and scheduler.kv_cache.num_free_blocks() == 8


def test_chunked_prefill_splits_long_prompt_within_budget():
    scheduler = make_scheduler(max_num_batched_tokens=8)
    request = Request("long", [1] * 30, SamplingParams(max_tokens=2, ignore_eos=True))
    scheduler.add_request(request)
    chunks = []
    while scheduler.has_unfinished():
        out = scheduler.schedule()
        chunks.append(out.scheduled[0].num_tokens)
        scheduler.update(out, [7])
    assert chunks == [8, 8, 8, 6, 1]
    assert request.output_token_ids == [7, 7]


def test_without_chunked_prefill_a_long_prompt_waits_for_budget():
    scheduler = make_scheduler(max_num_batched_tokens=8, enable_chunked_prefill=False)
    scheduler.add_request(Request("long", [1] * 30, SamplingParams()))
    assert scheduler.schedule().scheduled == []
