"""The priority policy: admission by priority (ties by arrival), victims by priority, waiting requests preempting."""

import random

import pytest

from kvserve.config import SchedulerConfig
from kvserve.interfaces import SchedulerOutput
from kvserve.kv_cache.paged import PagedKVCacheManager
from kvserve.request import Request, RequestStatus
from kvserve.sampling_params import SamplingParams
from kvserve_scheduler_priority.scheduler import PriorityScheduler

BS = 4


def make_scheduler(usable_blocks: int, **cfg) -> PriorityScheduler:
    kv_cache = PagedKVCacheManager(usable_blocks + 1, BS, enable_prefix_caching=True)
    return PriorityScheduler(SchedulerConfig(**cfg), kv_cache, max_model_len=64)


def req(rid: str, priority: int, prompt_len: int = 4, max_tokens: int = 4, first_token: int = 0) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    # Distinct first tokens keep prefix caching out of the way unless a test wants it.
    return Request(rid, [first_token, *range(1, prompt_len)], params, priority=priority)


def step(scheduler: PriorityScheduler, token: int = 7) -> SchedulerOutput:
    out = scheduler.schedule()
    assert out.num_batched_tokens <= scheduler.config.max_num_batched_tokens
    assert len(out.scheduled) <= scheduler.config.max_num_seqs
    scheduler.update(out, [[token] if item.completes_sequence else [] for item in out.scheduled])
    return out


def run_to_completion(scheduler: PriorityScheduler, requests: list[Request]) -> list[str]:
    """Ids in order of first admission; checks that all finish and no block leaks."""
    admitted: list[str] = []
    for _ in range(10_000):
        if not scheduler.has_unfinished():
            break
        for item in step(scheduler).scheduled:
            if item.request.request_id not in admitted:
                admitted.append(item.request.request_id)
    for request in requests:
        assert request.status is RequestStatus.FINISHED_LENGTH
        assert len(request.output_token_ids) == request.sampling_params.max_tokens
    kv_cache = scheduler.kv_cache
    assert kv_cache.num_free_blocks() == kv_cache.num_blocks - 1 and not any(kv_cache.pool.ref_counts)
    return admitted


def test_admission_in_priority_order_ties_by_arrival():
    scheduler = make_scheduler(64, max_num_seqs=1)
    requests = [req("p5", 5, first_token=1), req("p1a", 1, first_token=2), req("p1b", 1, first_token=3)]
    requests.append(req("p0", 0, first_token=4))
    for r in requests:
        scheduler.add_request(r)
    assert run_to_completion(scheduler, requests) == ["p0", "p1a", "p1b", "p5"]


def test_running_victims_are_least_urgent_latest_arrival_first():
    scheduler = make_scheduler(4)
    requests = [req("r0", 0, first_token=1), req("r1", 2, first_token=2), req("r2", 2, first_token=3)]
    requests.append(req("r3", 1, first_token=4))
    for r in requests:
        scheduler.add_request(r)
    step(scheduler)  # all four prompts fill one block each; their next token needs a second block
    out = step(scheduler)
    assert [r.request_id for r in out.preempted] == ["r2", "r1"]
    assert [i.request.request_id for i in out.scheduled] == ["r0", "r3"]
    assert requests[0].num_preemptions == requests[3].num_preemptions == 0
    run_to_completion(scheduler, requests)


def test_waiting_urgent_request_preempts_a_less_urgent_running_one():
    scheduler = make_scheduler(4)
    low = [req("low0", 5, prompt_len=6, first_token=1), req("low1", 5, prompt_len=6, first_token=2)]
    for r in low:
        scheduler.add_request(r)
    step(scheduler)  # 2 blocks each, enough for two more tokens: the pool is full
    peer, urgent = req("peer", 5, first_token=3), req("urgent", 0, first_token=4)
    scheduler.add_request(peer)
    out = step(scheduler)
    assert out.preempted == [] and scheduler.waiting == [peer], "equal priority waits"
    scheduler.add_request(urgent)
    out = step(scheduler)
    assert [r.request_id for r in out.preempted] == ["low1"]
    assert [i.request.request_id for i in out.scheduled] == ["low0", "urgent"]
    assert [r.request_id for r in scheduler.waiting] == ["low1", "peer"], "equal priorities: arrival order"
    run_to_completion(scheduler, [*low, peer, urgent])


def test_only_the_first_admission_of_a_step_may_preempt():
    # A later victim could be computing blocks the first admission reuses in this very step.
    scheduler = make_scheduler(4)
    low = [req("low0", 5, prompt_len=6, first_token=1), req("low1", 5, prompt_len=6, first_token=2)]
    for r in low:
        scheduler.add_request(r)
    step(scheduler)
    urgent = [req("u0", 0, prompt_len=8, first_token=3), req("u1", 0, prompt_len=8, first_token=4)]
    for r in urgent:
        scheduler.add_request(r)
    out = step(scheduler)
    assert [r.request_id for r in out.preempted] == ["low1"]
    assert [i.request.request_id for i in out.scheduled] == ["low0", "u0"]
    assert [r.request_id for r in scheduler.waiting] == ["u1", "low1"]
    run_to_completion(scheduler, [*low, *urgent])


def test_waiting_urgent_request_preempts_for_a_sequence_slot():
    scheduler = make_scheduler(64, max_num_seqs=1)
    low, urgent = req("low", 3, max_tokens=8, first_token=1), req("urgent", 1, first_token=2)
    scheduler.add_request(low)
    step(scheduler)
    scheduler.add_request(urgent)
    out = step(scheduler)
    assert out.preempted == [low] and [i.request.request_id for i in out.scheduled] == ["urgent"]
    run_to_completion(scheduler, [low, urgent])


def test_preempted_request_resumes_from_its_cached_blocks():
    scheduler = make_scheduler(5)
    low = req("low", 5, prompt_len=9, max_tokens=3, first_token=1)
    scheduler.add_request(low)
    step(scheduler)  # 3 blocks, 2 of them full
    urgent = req("urgent", 0, prompt_len=9, max_tokens=2, first_token=2)
    scheduler.add_request(urgent)  # needs 3 blocks: takes the 2 free ones and low's partial block
    assert step(scheduler).preempted == [low]
    run_to_completion(scheduler, [low, urgent])
    assert scheduler.kv_cache.stats().prefix_hits >= 8, "low's computed blocks outlived its preemption"


@pytest.mark.parametrize("seed", range(4))
def test_random_priority_workload_finishes_without_leaks(seed):
    rng = random.Random(seed)
    scheduler = make_scheduler(12, max_num_batched_tokens=16, max_num_seqs=4)
    shared = [rng.randrange(50) for _ in range(8)]  # some prompts share a prefix: cache hits too
    requests = []
    for i in range(12):
        prompt = (shared if rng.random() < 0.5 else []) + [rng.randrange(50) for _ in range(rng.randint(1, 12))]
        params = SamplingParams(max_tokens=rng.randint(1, 12), ignore_eos=True)
        requests.append(Request(f"r{i}", prompt, params, priority=rng.randrange(3)))
    for r in requests:
        scheduler.add_request(r)
    run_to_completion(scheduler, requests)
