"""StepInput, as the driver builds it from a real scheduler's plan and every rank reads it."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from kvserve.config import SchedulerConfig
from kvserve.kv_cache.paged import PagedKVCacheManager
from kvserve.request import Request
from kvserve.runner.step_input import StepInput
from kvserve.runner.step_logits import StepLogits
from kvserve.sampling_params import SamplingParams
from kvserve.scheduling import BatchingScheduler

BLOCK = 4


class FifoScheduler(BatchingScheduler):
    name = "fifo"

    def admission_key(self, request: Request) -> float:
        return request.arrival_time

    def preemption_victim(self, running: list[Request]) -> Request:
        return running[-1]


def _plan(budget: int):
    """A plan of a 10-token prompt asking for prompt logprobs, chunked by ``budget``, and a
    3-token prompt: one plan per step until both prefilled."""
    manager = PagedKVCacheManager(32, BLOCK)
    scheduler = FifoScheduler(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=4), manager, 64)
    scheduler.add_request(Request("a", list(range(100, 110)), SamplingParams(prompt_logprobs=1)))
    scheduler.add_request(Request("b", [7, 8, 9], SamplingParams()))
    return scheduler.schedule(), manager


def test_from_plan_lays_out_tokens_tables_samples_and_metadata():
    plan, manager = _plan(budget=9)  # a: tokens 0..8 of 10 (no sample); b gets no room
    assert [(i.request.request_id, i.start, i.num_tokens) for i in plan.scheduled] == [("a", 0, 9)]
    step = StepInput.from_plan(plan, manager, {"ids": lambda r: ord(r.request_id)})
    assert step.token_ids.tolist() == list(range(100, 109))
    assert step.query_start_loc.tolist() == [0, 9] and step.context_lens.tolist() == [0]
    assert step.block_tables == (tuple(manager.block_table("a")),) and len(step.block_tables[0]) == 3
    assert step.sample_indices.tolist() == [] and step.sample_start_loc.tolist() == [0, 0]
    assert step.prompt_logit_spans == {0: (0, 9)}  # rows 0..8 predict prompt tokens 1..9
    assert step.token_metadata["ids"].tolist() == [ord("a")] * 9


def test_completing_chunks_sample_their_last_token():
    plan, manager = _plan(budget=16)
    step = StepInput.from_plan(plan, manager, {"len": lambda r: r.num_prompt_tokens})
    assert step.query_start_loc.tolist() == [0, 10, 13] and step.context_lens.tolist() == [0, 0]
    assert step.sample_indices.tolist() == [9, 12] and step.sample_start_loc.tolist() == [0, 1, 2]
    assert step.prompt_logit_spans == {0: (0, 9)}  # the last prompt token predicts output, not prompt
    assert step.token_metadata["len"].tolist() == [10] * 10 + [3] * 3
    again = pickle.loads(pickle.dumps(step))  # what a tensor-parallel worker receives
    for field in ("token_ids", "query_start_loc", "context_lens", "sample_indices", "sample_start_loc"):
        assert np.array_equal(getattr(again, field), getattr(step, field))
    assert again.block_tables == step.block_tables and again.prompt_logit_spans == step.prompt_logit_spans


def test_inconsistent_lengths_are_refused_naming_the_field():
    plan, manager = _plan(budget=16)
    step = StepInput.from_plan(plan, manager)
    with pytest.raises(ValueError, match=r"token_metadata\['x'\]: 3 entries for 2 chunks of 13 tokens"):
        StepInput(**{**vars(step), "token_metadata": {"x": np.zeros(3, np.int64)}})
    with pytest.raises(ValueError, match="block_tables: 1 entries"):
        StepInput(**{**vars(step), "block_tables": step.block_tables[:1]})
    with pytest.raises(ValueError, match="sample_start_loc at 2 .samples: 1"):
        StepInput(**{**vars(step), "sample_indices": step.sample_indices[:1]})


def test_step_logits_give_each_chunk_its_rows():
    logits = StepLogits(torch.arange(8.0).view(4, 2), np.array([0, 2, 2, 4]))
    assert [list(logits.rows(i)) for i in range(3)] == [[0, 1], [], [2, 3]]
    assert logits.sampled_chunks == [0, 2]


def test_decode_chunks_with_drafts_carry_them_and_sample_one_row_per_draft_plus_one():
    manager = PagedKVCacheManager(32, BLOCK)
    scheduler = FifoScheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4), manager, 64)
    a, b = Request("a", [1, 2, 3], SamplingParams(max_tokens=20)), Request("b", [4, 5], SamplingParams(max_tokens=20))
    for request in (a, b):
        scheduler.add_request(request)
    scheduler.update(scheduler.schedule(), [[10], [20]])  # both prefilled, one token each
    a.draft_token_ids = [11, 12, 13]  # b decodes plainly
    step = StepInput.from_plan(scheduler.schedule(), manager)
    assert step.token_ids.tolist() == [10, 11, 12, 13, 20]
    assert step.context_lens.tolist() == [3, 2] and step.query_start_loc.tolist() == [0, 4, 5]
    assert step.sample_indices.tolist() == [0, 1, 2, 3, 4] and step.sample_start_loc.tolist() == [0, 4, 5]
