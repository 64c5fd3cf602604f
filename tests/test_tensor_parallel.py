"""Tensor parallelism over two gloo worker processes (one torch thread each): greedy fp32 tokens
identical to one device and to HF for tiny Llama, Qwen2 and Qwen3, with KV heads split (2 over 2
ranks) and replicated (1 KV head), and vocabularies (331, 330) that leave padding in the last
rank's shard of the vocab-parallel embedding and LM head (untied and tied); a worker that dies
or cannot start is an error naming its rank, and no worker process outlives the engine."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
import torch
import transformers

from kvserve import LLM, SamplingParams
from kvserve.errors import EngineDeadError, WorkerError
from kvserve.testing.hf_models import build_tiny_model

PROMPTS = [
    "Paris is the capital of",
    "The quick brown fox jumps over the lazy dog. Continuous batching admits new requests",
    "0123456789",
    "abc",
]
NEW_TOKENS = 16
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS)
ENGINE = {"dtype": "float32", "max_model_len": 128, "num_kv_blocks": 64}
VARIANTS = {
    "llama-kv2-vocab331": ("llama", {"vocab_size": 331}),
    "qwen2-kv2-tied-vocab330": ("qwen2", {"tie_word_embeddings": True, "vocab_size": 330}),
    "qwen3-kv1-replicated": ("qwen3", {"num_key_value_heads": 1}),
}


def _tokens(llm, prompt_ids):
    return [o.outputs[0].token_ids for o in llm.generate(prompt_ids, GREEDY, use_tqdm=False)]


def _hf_greedy(path, prompt_ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        return [
            model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=NEW_TOKENS)[0, len(ids) :].tolist()
            for ids in prompt_ids
        ]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_two_ranks_match_one_device_and_hf(variant, tmp_path):
    arch, overrides = VARIANTS[variant]
    path = build_tiny_model(arch, tmp_path / variant, randomize_vectors=True, **overrides)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
    expected = _hf_greedy(path, prompt_ids)
    assert _tokens(LLM(str(path), **ENGINE), prompt_ids) == expected
    # A small token budget also runs chunked prefills across the ranks.
    llm = LLM(str(path), tensor_parallel_size=2, max_num_batched_tokens=8, **ENGINE)
    pids = [p.pid for p in llm.engine.executor.procs]
    try:
        assert _tokens(llm, prompt_ids) == expected
        assert llm.engine.kv_cache_manager.num_free_blocks() == 64
    finally:
        llm.engine.shutdown()
    assert all(_gone(pid) for pid in pids)


def test_killed_worker_is_reported_by_rank_and_every_worker_stops(tmp_path):
    path = build_tiny_model("llama", tmp_path / "llama")
    llm = LLM(str(path), tensor_parallel_size=2, **ENGINE)
    engine = llm.engine
    procs = engine.executor.procs
    engine.add_request(
        "r", engine.check_request([1, 5, 7], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    )
    for _ in range(3):
        engine.step()
    os.kill(procs[1].pid, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(EngineDeadError, match="tensor-parallel worker rank 1 failed in a step: its process .* -9"):
        while engine.has_unfinished_requests():
            engine.step()
    assert time.monotonic() - started < 10
    assert all(not p.is_alive() for p in procs) and all(_gone(p.pid) for p in procs)
    with pytest.raises(EngineDeadError):
        engine.step()


def test_a_worker_that_cannot_start_is_named_and_none_is_left(tmp_path):
    # 4 query heads cannot split over 3 ranks: every rank refuses while building its shard.
    path = build_tiny_model("llama", tmp_path / "llama")
    before = set(_children())
    with pytest.raises(
        WorkerError, match=r"worker rank \d failed to start: ConfigError: tensor_parallel_size: .*4 query"
    ):
        LLM(str(path), tensor_parallel_size=3, **ENGINE)
    assert set(_children()) <= before


def _children() -> list[int]:
    """Pids of this process's live children (from /proc)."""
    me, kids = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] != "Z":
                kids.append(int(entry))
    return kids


def test_parallel_config_fields_are_checked():
    from kvserve.config import EngineConfig
    from kvserve.errors import ConfigError

    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        EngineConfig.from_flat(model="m", tensor_parallel_size=0)
    with pytest.raises(ConfigError, match="distributed_executor_backend"):
        EngineConfig.from_flat(model="m", distributed_executor_backend="threads")
    assert (
        EngineConfig.from_flat(model="m", distributed_executor_backend="ray").parallel.distributed_executor_backend
        == "ray"
    )


def test_ray_backend_without_ray_names_the_extra(tmp_path, monkeypatch):
    from kvserve.errors import MissingExtraError

    monkeypatch.setitem(sys.modules, "ray", None)  # as if ray were not installed
    path = build_tiny_model("llama", tmp_path / "llama")
    with pytest.raises(
        MissingExtraError, match=r"distributed_executor_backend='ray' needs the 'ray' extra.*kvserve-core\[ray\]"
    ):
        LLM(str(path), tensor_parallel_size=2, distributed_executor_backend="ray", **ENGINE)
