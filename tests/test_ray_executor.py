"""Tensor parallelism through the Ray executor on a local Ray instance with this machine's 2 CPUs:
greedy fp32 tokens of two ranks identical to one device and to HF for the tiny Llama; an actor
killed mid-generation, or one whose shard cannot be built, is an error naming its rank, and no
actor nor placement group outlives the engine."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
import transformers

from kvserve import LLM, SamplingParams
from kvserve.errors import EngineDeadError, WorkerError
from kvserve.testing.hf_models import build_tiny_model
from kvserve.testing.quant_parity import PROMPTS, hf_greedy, kvserve_greedy

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'kvserve-core[ray]')")

NEW_TOKENS = 16
ENGINE = {"dtype": "float32", "max_model_len": 128, "num_kv_blocks": 64}
RAY = {"tensor_parallel_size": 2, "distributed_executor_backend": "ray"}


def _gone(pid: int, within: float = 10.0) -> bool:
    """Whether process ``pid`` exits within ``within`` seconds (Ray kills actors asynchronously)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def local_ray():
    """A Ray instance the tests started (an engine joins it and leaves it running)."""
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        yield
    finally:
        ray.shutdown()


def _placement_groups() -> list[str]:
    """States of the Ray instance's placement groups not removed."""
    return [pg["state"] for pg in ray.util.placement_group_table().values() if pg["state"] != "REMOVED"]


def _actor_processes(within: float = 10.0) -> list[int]:
    """Pids of live kvserve Ray actors (Ray titles them ``ray::RayWorker``), after waiting up to
    ``within`` seconds for there to be none."""
    deadline = time.monotonic() + within
    while True:
        pids = []
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    if cmdline.read().startswith(b"ray::RayWorker"):
                        pids.append(int(entry))
            except (OSError, ValueError):
                continue
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.05)


def test_two_ray_ranks_match_one_device_and_hf(tmp_path, capsys):
    path = build_tiny_model("llama", tmp_path / "llama", randomize_vectors=True)
    prompt_ids = [transformers.AutoTokenizer.from_pretrained(path).encode(p) for p in PROMPTS]
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    expected = [tokens for tokens, _ in hf_greedy(hf_model, prompt_ids, NEW_TOKENS)]
    assert [t for t, _ in kvserve_greedy(LLM(str(path), **ENGINE), prompt_ids, NEW_TOKENS)] == expected
    started = time.monotonic()
    # No Ray is running: the engine starts a local one and shuts it down with itself.
    llm = LLM(str(path), max_num_batched_tokens=8, **RAY, **ENGINE)  # chunked prefills across ranks too
    up = time.monotonic() - started
    pids = llm.engine.executor.pids
    try:
        assert len(set(pids)) == 2 and os.getpid() not in pids
        assert [t for t, _ in kvserve_greedy(llm, prompt_ids, NEW_TOKENS)] == expected
        assert llm.engine.kv_cache_manager.num_free_blocks() == 64
    finally:
        llm.engine.shutdown()
    assert not ray.is_initialized()
    assert all(_gone(pid) for pid in pids)
    with capsys.disabled():
        print(f"\nray TP=2: {len(PROMPTS)} prompts x {NEW_TOKENS} greedy tokens == TP=1 == HF; "
              f"local Ray + 2 actors up in {up:.1f} s, all in {time.monotonic() - started:.1f} s")  # fmt: skip


def test_killed_actor_is_reported_by_rank_and_every_actor_stops(tmp_path, local_ray, capsys):
    path = build_tiny_model("llama", tmp_path / "llama")
    engine = LLM(str(path), **RAY, **ENGINE).engine
    pids = engine.executor.pids
    engine.add_request(
        "r", engine.check_request([1, 5, 7], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    )
    for _ in range(3):
        engine.step()
    os.kill(pids[1], signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(EngineDeadError, match=rf"worker rank 1 \(Ray actor, pid {pids[1]}\) failed in a step: .*Died"):
        while engine.has_unfinished_requests():
            engine.step()
    reported = time.monotonic() - started
    assert reported < 10
    assert all(_gone(pid) for pid in pids) and _actor_processes() == []
    assert _placement_groups() == []
    assert ray.is_initialized()  # the engine did not start this Ray, so it leaves it running
    with pytest.raises(EngineDeadError):
        engine.step()
    with capsys.disabled():
        print(f"\nray: rank 1's actor SIGKILLed after 3 steps, reported by the driver in {reported:.2f} s")


def test_an_actor_that_cannot_build_its_shard_is_named_and_none_is_left(tmp_path, local_ray):
    # An MLP of 127 columns cannot split over 2 ranks: every rank refuses while building its shard.
    path = build_tiny_model("llama", tmp_path / "llama", intermediate_size=127)
    refused = r"worker rank \d \(Ray actor, pid \d+\) failed to start: ConfigError: tensor_parallel_size: .*127"
    with pytest.raises(WorkerError, match=refused):
        LLM(str(path), **RAY, **ENGINE)
    assert _placement_groups() == []
    assert _actor_processes() == []
