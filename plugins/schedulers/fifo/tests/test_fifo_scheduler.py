"""FIFO specifics beyond the scheduler contract (``test_contract.py``): exact chunk sizes and
which request a tiny cache preempts."""

from kvserve.config import SchedulerConfig
from kvserve.kv_cache.paged import PagedKVCacheManager
from kvserve.request import Request
from kvserve.sampling_params import SamplingParams
from kvserve.testing.scheduler_driver import Arrival, SchedulerDriver
from kvserve_scheduler_fifo.scheduler import FifoScheduler


def make_scheduler(num_blocks=64, block_size=4, **cfg):
    config = SchedulerConfig(**cfg)
    return FifoScheduler(config, PagedKVCacheManager(num_blocks, block_size), max_model_len=64)


def test_tiny_cache_preempts_the_latest_request_and_all_finish():
    scheduler = make_scheduler(num_blocks=9, block_size=4, max_num_batched_tokens=64, max_num_seqs=8)
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    result = SchedulerDriver(scheduler).run([Arrival(0, f"r{i}", [1] * 10, params) for i in range(3)])
    assert result.preemptions, "the tiny cache should force preemption"
    assert "r0" not in result.preemptions, "FIFO must preempt the latest admitted request first"
    assert len(result.outputs) == 3 and scheduler.kv_cache.num_free_blocks() == 8


def test_chunked_prefill_splits_long_prompt_within_budget():
    driver = SchedulerDriver(make_scheduler(max_num_batched_tokens=8))
    driver.add(Arrival(0, "long", [1] * 30, SamplingParams(max_tokens=2, ignore_eos=True)))
    chunks = []
    while driver.scheduler.has_unfinished():
        chunks += [item.num_tokens for item in driver.step().scheduled]
    assert chunks == [8, 8, 8, 6, 1]


def test_without_chunked_prefill_a_long_prompt_waits_for_budget():
    scheduler = make_scheduler(max_num_batched_tokens=8, enable_chunked_prefill=False)
    scheduler.add_request(Request("long", [1] * 30, SamplingParams()))
    assert scheduler.schedule().scheduled == []
