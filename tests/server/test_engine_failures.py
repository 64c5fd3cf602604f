"""Issue 9: a failed forward, a shutdown and a failed request reach every caller at once, AsyncLLM and HTTP;
and (issue 14) the same with the engine core in its own process, killed with SIGKILL too."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from kvserve.config import EngineConfig
from kvserve.errors import EngineDeadError
from kvserve.frontend.async_llm import AsyncLLM
from kvserve.sampling import Sampler
from kvserve.sampling_params import SamplingParams
from kvserve.testing.engine_faults import FailingForward

MODEL = "tiny"
LONG = 900  # tokens: with a step of at least STEP seconds, far longer than the test waits
STEP = 0.01


def _long_params() -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=LONG, ignore_eos=True, output_kind="delta")


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _engine(tiny_model_dir: Path, mode: str, setup: Callable | None = None, **fields) -> AsyncLLM:
    """The tiny model's engine on a thread (``mode="thread"``) or in its own process (``"process"``)."""
    config = EngineConfig.from_flat(model=str(tiny_model_dir), engine_process=mode == "process", **fields)
    return AsyncLLM.from_config(config, core_setup=setup)


def _in_engine(llm: AsyncLLM) -> int:
    stats = llm.stats()
    return stats.num_running + stats.num_waiting


@pytest.mark.parametrize(
    "mode, death",
    [("thread", "forward"), ("process", "forward"), ("process", "kill -9")],
    ids=["thread-forward", "process-forward", "process-kill9"],
)
def test_a_failing_forward_reaches_20_async_and_20_http_callers_within_5s(
    tiny_model_dir: Path, make_server, tmp_path: Path, mode: str, death: str
) -> None:
    broken = tmp_path / "broken"  # the tiny model is too quick to keep 40 requests in flight without the delay
    llm = _engine(tiny_model_dir, mode, FailingForward(str(broken), delay=STEP), max_num_seqs=64)
    errors: dict[str, float] = {}  # caller -> when its error arrived
    outcomes: dict[str, str] = {}

    async def consumer(i: int) -> None:
        try:
            async for _ in llm.generate(f"consumer {i} says", _long_params(), f"async-{i}"):
                pass
            outcomes[f"async-{i}"] = "finished"
        except EngineDeadError:
            errors[f"async-{i}"] = time.monotonic()

    def http_client(i: int, url: str) -> None:
        body = {"model": MODEL, "prompt": f"client {i} says", "max_tokens": LONG, "temperature": 0}
        name = f"http-{i}"
        if i % 2:  # streamed through the official client: the error event raises
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
            try:
                for _ in client.completions.create(stream=True, extra_body={"ignore_eos": True}, **body):
                    pass
                outcomes[name] = "finished"
            except openai.APIError:
                errors[name] = time.monotonic()
        else:
            response = httpx.post(f"{url}/v1/completions", json={**body, "ignore_eos": True}, timeout=30)
            if response.status_code == 503 and response.json()["error"]["code"] == "engine_dead":
                errors[name] = time.monotonic()
            else:
                outcomes[name] = f"HTTP {response.status_code}"

    try:
        with make_server(llm) as server, ThreadPoolExecutor(20) as pool:
            consumers = threading.Thread(target=lambda: asyncio.run(_gather(consumer(i) for i in range(20))))
            consumers.start()
            futures = [pool.submit(http_client, i, server.url) for i in range(20)]
            _wait_for(lambda: _in_engine(llm) == 40, 60, "40 requests in the engine")
            time.sleep(0.2)  # a few decode steps with all of them running
            if death == "forward":
                broken.touch()
            else:
                os.kill(llm.client.process.pid, signal.SIGKILL)
            killed = time.monotonic()
            consumers.join(timeout=30)
            for future in futures:
                future.result(timeout=30)
            assert outcomes == {}, "every caller should have got the error"
            assert len(errors) == 40
            slowest = max(errors.values()) - killed
            print(f"40 callers got the engine's death in at most {slowest:.2f}s")
            assert slowest < 5.0
            assert httpx.get(f"{server.url}/health").status_code == 503
    finally:
        llm.shutdown()
    if mode == "thread":
        assert llm.engine.kv_cache_manager.num_free_blocks() == llm.engine.kv_cache_manager.num_blocks - 1
    else:  # the core is gone, with the exit of its death
        assert llm.client.process.exitcode == (1 if death == "forward" else -signal.SIGKILL)


async def _gather(coroutines) -> None:
    await asyncio.gather(*coroutines)


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_shutdown_answers_pending_and_later_generate_calls(tiny_model_dir: Path, mode: str) -> None:
    llm = _engine(tiny_model_dir, mode)

    async def consume(i: int) -> None:
        async for _ in llm.generate(f"pending {i}", _long_params(), f"pending-{i}"):
            pass

    async def main() -> list[BaseException]:
        tasks = [asyncio.create_task(consume(i)) for i in range(10)]
        while _in_engine(llm) < 10:
            await asyncio.sleep(0.02)
        await asyncio.to_thread(llm.shutdown)
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
        late = [asyncio.create_task(consume(100 + i)) for i in range(10)]
        return results + await asyncio.wait_for(asyncio.gather(*late, return_exceptions=True), 5)

    results = asyncio.run(main())
    assert all(isinstance(r, EngineDeadError) and "shut down" in str(r) for r in results), results
    if mode == "thread":
        assert not llm.engine.has_unfinished_requests()
    else:
        assert llm.client.process.exitcode == 0


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_generate_calls_racing_the_engines_death_all_get_the_error(tiny_model_dir: Path, mode: str) -> None:
    llm = _engine(tiny_model_dir, mode, FailingForward())

    async def consume(i: int) -> None:
        async for _ in llm.generate(f"racer {i}", _long_params(), f"racer-{i}"):
            pass

    async def main() -> list[BaseException]:
        # The first ones kill the loop while the rest are registering.
        tasks = [asyncio.create_task(consume(i)) for i in range(50)]
        return await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)

    try:
        results = asyncio.run(main())
    finally:
        llm.shutdown()
    assert all(isinstance(r, EngineDeadError) for r in results), results
    # What killed the loop reaches the frontend as it was raised, whichever transport carried it.
    assert type(llm.dead_error) is EngineDeadError
    assert str(llm.dead_error) == "the engine stopped: its step failed with RuntimeError: simulated device failure"


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_request_the_engine_refuses_gets_the_error_and_the_engine_serves_on(tiny_model_dir: Path, mode: str) -> None:
    """A batch-level processor's ``validate_params`` runs in the engine, so the step loop's transport
    carries the refusal back to the caller; the engine keeps serving, the refused id included."""
    llm = _engine(tiny_model_dir, mode, logits_processors=["no_repeat_ngram"])
    refused = SamplingParams(max_tokens=4, extra_args={"no_repeat_ngram_size": 0})
    fine = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, extra_args={"no_repeat_ngram_size": 2})

    async def generate(params: SamplingParams) -> list[int]:
        async def last() -> list[int]:
            async for output in llm.generate("the quick brown fox", params, "same-id"):
                final = output
            return final.outputs[0].token_ids

        return await asyncio.wait_for(last(), 30)  # a refusal that never arrives would hang the caller

    try:
        with pytest.raises(ValueError, match=r"extra_args\.no_repeat_ngram_size: must be a positive integer, got 0"):
            asyncio.run(generate(refused))
        assert len(asyncio.run(generate(fine))) == 4
        assert llm.dead_error is None
        _wait_for(lambda: _in_engine(llm) == 0, 5, "the engine to hold no request")  # the stats lag a step behind
    finally:
        llm.shutdown()


@pytest.mark.parametrize("server", ["thread", "process"], indirect=True)  # process_llm fails seed 666 itself
def test_a_request_the_engine_fails_gets_500_and_a_bystander_stream_completes(
    server, http: httpx.Client, idle: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = {"model": MODEL, "prompt": "bystander says", "max_tokens": 150, "temperature": 0, "ignore_eos": True}
    reference = http.post("/v1/completions", json=body).json()["choices"][0]["text"]
    process = Sampler.process

    def fails_for_seed_666(self, logits, requests, **options):
        logits, batch = process(self, logits, requests, **options)
        for row, request in enumerate(requests):
            if request.sampling_params.seed == 666:
                batch.fail(row, "sampling", RuntimeError("a bug in this request's sampling"))
        return logits, batch

    monkeypatch.setattr(Sampler, "process", fails_for_seed_666)
    streamed: list[str] = []

    def bystander() -> None:
        with httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    streamed.append(json.loads(line[6:])["choices"][0]["text"])

    thread = threading.Thread(target=bystander)
    thread.start()
    bad = {"model": MODEL, "prompt": "doomed", "max_tokens": 20, "seed": 666, "temperature": 1.0}
    response = http.post("/v1/completions", json=bad)
    assert response.status_code == 500 and response.json()["error"]["code"] == "request_failed"
    stream_bad = http.post("/v1/completions", json={**bad, "stream": True})
    assert '"code":"request_failed"' in stream_bad.text.replace(" ", "") and stream_bad.text.endswith(
        "data: [DONE]\n\n"
    )
    thread.join(timeout=60)
    assert "".join(streamed) == reference
    idle(http)  # every KV block free again
    assert http.get("/health").status_code == 200
