"""Faults: disconnects, malformed requests, limits, keys, a dead engine. None may disturb other requests."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest

from kvserve.config import EngineConfig
from kvserve.config_sources import load_config
from kvserve.frontend.async_llm import AsyncLLM
from kvserve.testing.engine_faults import FailingForward

MODEL = "tiny"
PROMPTS = [f"Request {i}: the quick brown fox" for i in range(10)]
MAX_TOKENS = 12


def _greedy(http: httpx.Client, prompt: str, max_tokens: int = MAX_TOKENS) -> str:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    return http.post("/v1/completions", json=body).json()["choices"][0]["text"]


async def _stream(
    client: httpx.AsyncClient, prompt: str, disconnect_after: int | None, max_tokens: int = MAX_TOKENS
) -> str | None:
    """The streamed text, or None after leaving (closing the connection) once ``disconnect_after`` chunks came."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    body["ignore_eos"] = True
    text, chunks = "", 0
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if disconnect_after is not None and chunks >= disconnect_after:
                return None
            if line.startswith("data: {"):
                text += json.loads(line[6:])["choices"][0]["text"]
                chunks += 1
            elif line == "data: [DONE]":
                return text
    raise AssertionError("stream ended without [DONE]")


@pytest.mark.parametrize("server", ["thread", "process"], indirect=True)
def test_200_concurrent_streams_with_a_third_disconnecting(server, http: httpx.Client, idle: Callable) -> None:
    expected = {p: _greedy(http, p) for p in PROMPTS}
    rng = random.Random(0)
    plan = [(PROMPTS[i % len(PROMPTS)], rng.randrange(MAX_TOKENS) if i % 3 == 0 else None) for i in range(200)]

    async def storm() -> list[str | None]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
            return await asyncio.gather(*(_stream(client, p, after) for p, after in plan))

    results = asyncio.run(storm())
    completed = [(prompt, text) for (prompt, after), text in zip(plan, results) if after is None]
    assert len(completed) == 133
    assert all(text == expected[prompt] for prompt, text in completed)
    idle(http)  # every KV block back in the free pool, nothing running or waiting
    assert _greedy(http, PROMPTS[0]) == expected[PROMPTS[0]]


@pytest.mark.parametrize("server", ["thread", "process"], indirect=True)
def test_disconnect_mid_stream_frees_blocks_at_once(http: httpx.Client, idle: Callable, metrics: Callable) -> None:
    before = metrics(http)["kvserve:generation_tokens_total"]
    body = {"model": MODEL, "prompt": "A long story", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as response:
        lines = response.iter_lines()  # held: a dropped line iterator closes the response, i.e. disconnects
        first = json.loads(next(line for line in lines if line.startswith("data: {"))[6:])
        assert first["choices"][0]["finish_reason"] is None, first
        during = metrics(http)
        assert during["kvserve:kv_cache_free_blocks"] < during["kvserve:kv_cache_total_blocks"]
    after = idle(http, timeout=2.0)
    assert after["kvserve:generation_tokens_total"] - before < 1000  # stopped long before max_tokens


@pytest.mark.parametrize("server", ["thread", "process"], indirect=True)
def test_disconnect_of_a_non_streamed_request_aborts_it(server, http: httpx.Client, idle: Callable, metrics) -> None:
    before = metrics(http)["kvserve:generation_tokens_total"]
    body = {"model": MODEL, "prompt": "Another long story", "max_tokens": 1000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=server.url, timeout=0.3) as impatient:
        impatient.post("/v1/completions", json=body)
    after = idle(http, timeout=2.0)
    assert after["kvserve:generation_tokens_total"] - before < 1000


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
MALFORMED = [
    # (path, raw body or JSON value, status, param)
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", b"", 400, None),
    ("/v1/completions", [1, 2], 422, None),
    ("/v1/completions", {}, 422, "prompt"),
    ("/v1/completions", {"prompt": 123}, 422, "prompt"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "ten"}, 422, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "temperature": "hot"}, 422, "temperature"),
    ("/v1/completions", {"prompt": "x", "bogus": 1}, 422, "bogus"),
    ("/v1/completions", {"prompt": "x", "temperature": -0.5}, 400, "temperature"),
    ("/v1/completions", {"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"prompt": "x", "n": 0}, 400, "n"),
    ("/v1/completions", {"prompt": "x", "logprobs": 50}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "x", "presence_penalty": 3}, 400, "presence_penalty"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 100000}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("/v1/completions", {"prompt": []}, 400, "prompt"),
    ("/v1/completions", {"prompt": [[5, 999999]]}, 400, "prompt"),
    # Issue 9's requests: each once stopped the engine, the process or sampled garbage; now a 400 at the door.
    ("/v1/completions", {"prompt": "x", "seed": 18446744073709551616}, 400, "seed"),
    ("/v1/completions", {"prompt": "x", "top_k": 9223372036854775808}, 400, "top_k"),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": [1000000000], "min_tokens": 1}, 400, "stop_token_ids"),
    ("/v1/completions", {"prompt": "x", "n": 20000}, 400, "n"),
    ("/v1/completions", {"prompt": [[-1]]}, 400, "prompt"),
    ("/v1/completions", b'{"prompt": "x", "temperature": 1e400}', 400, "temperature"),
    # Their neighbours.
    ("/v1/completions", {"prompt": [[-1]], "echo": True}, 400, "prompt"),  # checked before echo decodes it
    ("/v1/completions", {"prompt": "x", "seed": 2**63 - 1, "n": 2}, 400, "seed"),  # seed + 1 overflows int64
    ("/v1/completions", {"prompt": "x", "top_k": 385}, 400, "top_k"),  # the tiny vocabulary is 384
    ("/v1/completions", b'{"prompt": "x", "top_p": NaN}', 400, "top_p"),
    ("/v1/completions", b'{"prompt": "x", "presence_penalty": -Infinity}', 400, "presence_penalty"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"5": 1e308 * 10}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"384": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"٥": 1}}, 400, "logit_bias"),  # an Arabic-Indic 5
    ("/v1/completions", {"prompt": "x", "allowed_token_ids": [-5]}, 400, "allowed_token_ids"),
    ("/v1/completions", {"prompt": ["x"] * 65}, 400, "n"),  # 65 sequences, over max_sequences_per_request
    ("/v1/completions", {"prompt": ["x"] * 22, "n": 3}, 400, "n"),
    ("/v1/completions", {"prompt": "x", "stop": ["s"] * 33}, 400, "stop"),
    ("/v1/completions", {"prompt": "x", "stop": "s" * 1025}, 400, "stop"),
    ("/v1/completions", {"prompt": "x", "bad_words": ["w"] * 129}, 400, "bad_words"),
    ("/v1/completions", {"prompt": "x", "bad_words": [""]}, 400, "bad_words"),
    ("/v1/completions", {"prompt": "x", "priority": 2**70}, 400, "priority"),
    ("/v1/completions", {"prompt": "x", "max_tokens": -(2**64)}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "best_of": 3}, 400, "best_of"),
    ("/v1/completions", {"prompt": "x", "suffix": "and then"}, 400, "suffix"),
    ("/v1/chat/completions", {**CHAT, "n": 20000}, 400, "n"),
    ("/v1/chat/completions", {**CHAT, "seed": -(2**63) - 1}, 400, "seed"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "guided_json": {}, "guided_regex": "a"}, 400, "guided_json"),
    ("/v1/completions", {"prompt": "x", "structured_outputs": {"choice": []}}, 400, "structured_outputs"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "required"}, 400, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "reasoning_effort": "high"}, 400, "reasoning_effort"),
    ("/v1/completions", {"prompt": "x", "model": "gpt-4o"}, 404, "model"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, 422, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": "hello"}, 422, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, 422, "messages"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 3}, 400, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 99}, 400, "top_logprobs"),
    ("/tokenize", {}, 400, "prompt"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/v1/no-such-route", {}, 404, None),
]


@pytest.mark.parametrize("server", ["thread", "process"], indirect=True)
def test_malformed_requests_get_openai_errors_and_disturb_nobody(server, http: httpx.Client, metrics) -> None:
    expected = _greedy(http, PROMPTS[1], max_tokens=500)
    streamed: list[str | None] = []

    async def bystander() -> None:  # streams all the while the bad requests come in
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            streamed.append(await _stream(client, PROMPTS[1], None, max_tokens=500))

    running = threading.Thread(target=asyncio.run, args=(bystander(),))
    running.start()
    while metrics(http)["kvserve:num_requests_running"] == 0:
        time.sleep(0.005)
    overlapping = 0
    for path, body, status, param in MALFORMED:
        overlapping += running.is_alive()
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        response = http.post(path, content=raw, headers={"Content-Type": "application/json"})
        error = response.json()["error"]
        assert (response.status_code, error["param"]) == (status, param), (path, body, error)
        assert set(error) == {"message", "type", "param", "code"} and error["message"], error
        assert "Traceback" not in response.text
    running.join()
    assert overlapping >= 5, "too few bad requests came while the bystander streamed"
    assert streamed == [expected]
    assert http.get("/v1/completions").status_code == 405


def test_official_client_raises_the_matching_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x")
    with pytest.raises(openai.BadRequestError, match="max_model_len"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=10_000)
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": 42}])


def test_sequences_over_the_concurrency_limit_get_429(tiny_llm: AsyncLLM, make_server) -> None:
    body = {"model": MODEL, "prompt": "Hold on", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    fields = {"max_concurrent_sequences": 4, "max_sequences_per_request": 3}
    with make_server(tiny_llm, **fields) as limited, httpx.Client(base_url=limited.url) as http:
        # One request of n=2 and another of two prompts hold all four sequences.
        with (
            http.stream("POST", "/v1/completions", json={**body, "n": 2}),
            http.stream("POST", "/v1/completions", json={**body, "prompt": ["a", "b"]}),
        ):
            refused = http.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
            assert refused.status_code == 429 and refused.json()["error"]["type"] == "rate_limit_error"
            assert "4 of 4" in refused.json()["error"]["message"]
        deadline = time.monotonic() + 5
        while (
            response := http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "n": 3})
        ).status_code == 429:
            assert time.monotonic() < deadline, "slots were not released"
            time.sleep(0.05)
        assert response.status_code == 200 and len(response.json()["choices"]) == 3


def test_api_key_is_required_except_for_health(tiny_llm: AsyncLLM, make_server) -> None:
    with make_server(tiny_llm, api_key="s3cret") as guarded, httpx.Client(base_url=guarded.url) as http:
        assert http.get("/v1/models").status_code == 401
        wrong = http.get("/v1/models", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        assert http.get("/metrics").status_code == 401
        assert http.get("/health").status_code == 200
        client = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key="s3cret", max_retries=0)
        # Sampled at the default temperature: without ignore_eos the tiny model may draw EOS first.
        reply = client.completions.create(model=MODEL, prompt="x", max_tokens=2, extra_body={"ignore_eos": True})
        assert reply.usage.completion_tokens == 2


def test_bodies_over_the_limit_get_413(tiny_llm: AsyncLLM, make_server) -> None:
    big = json.dumps({"model": MODEL, "prompt": "x" * 5000}).encode()
    with make_server(tiny_llm, max_request_body_bytes=4096) as small, httpx.Client(base_url=small.url) as http:
        assert http.post("/v1/completions", content=big).status_code == 413
        chunked = http.post("/v1/completions", content=iter([big[:3000], big[3000:]]))  # no Content-Length
        assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "request_too_large"
        assert http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1}).status_code == 200


def test_unexpected_errors_are_500_without_details(served_llm: AsyncLLM, http: httpx.Client, monkeypatch) -> None:
    def broken(*args: object, **fields: object) -> None:
        raise ZeroDivisionError("internal detail")

    monkeypatch.setattr(served_llm, "validate_prompt", broken)
    response = http.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert response.status_code == 500 and response.json()["error"]["type"] == "server_error"
    assert "internal detail" not in response.text and "Traceback" not in response.text


@pytest.mark.parametrize("engine_process", [False, True], ids=["thread", "process"])
def test_dead_engine_answers_503(
    tiny_model_dir: Path, make_server, monkeypatch: pytest.MonkeyPatch, engine_process: bool
) -> None:
    config = EngineConfig.from_flat(model=str(tiny_model_dir), engine_process=engine_process)
    llm = AsyncLLM.from_config(config, core_setup=FailingForward() if engine_process else None)
    try:

        def crash() -> None:
            raise RuntimeError("simulated device failure")

        if not engine_process:  # the step itself breaks, not only the forward inside it
            monkeypatch.setattr(llm.engine, "step", crash)
        with make_server(llm) as doomed, httpx.Client(base_url=doomed.url) as http:
            first = http.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
            assert first.status_code == 503 and first.json()["error"]["code"] == "engine_dead"
            assert "simulated" not in first.text  # the cause is in the server log, not sent
            assert http.get("/health").status_code == 503
            assert http.post("/v1/chat/completions", json=CHAT).status_code == 503
    finally:
        llm.shutdown()


@pytest.mark.parametrize("source", ["config", "env"])
def test_an_empty_api_key_means_no_key(tiny_llm: AsyncLLM, make_server, source: str) -> None:
    key = ""
    if source == "env":  # KVSERVE_API_KEY= set but empty, as a deployment template leaves it
        key = load_config(environ={"KVSERVE_API_KEY": ""}).server.api_key
        assert key is None
    with make_server(tiny_llm, api_key=key) as open_server, httpx.Client(base_url=open_server.url) as http:
        assert http.get("/v1/models").status_code == 200
        assert http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1}).status_code == 200


@pytest.mark.parametrize("server", ["thread", "process"], indirect=True)
def test_a_long_tokenize_does_not_stall_a_stream(server, http: httpx.Client, tiny_llm: AsyncLLM) -> None:
    text = ("The quick brown fox, une école, 狐狸 🦊. " * 30000)[:1_000_000]  # ~1 MB; seconds to tokenize
    began = time.monotonic()
    expected_count = len(tiny_llm.tokenizer.encode(text))
    alone = time.monotonic() - began
    tokenized: list[float] = []

    def tokenize() -> None:
        started = time.monotonic()
        response = http.post("/tokenize", json={"prompt": text})
        tokenized.extend([started, time.monotonic()])
        assert response.status_code == 200 and response.json()["count"] == expected_count

    arrivals = []  # n=32 makes each step slower, so the stream outlasts the tokenization
    body = {"model": MODEL, "prompt": "A stream", "max_tokens": 1000, "ignore_eos": True, "stream": True, "n": 32}
    with httpx.Client(base_url=server.url, timeout=60) as streamer:
        with streamer.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            worker = threading.Thread(target=tokenize)
            for line in lines:
                if not line.startswith("data: {"):
                    continue
                arrivals.append(time.monotonic())
                if len(arrivals) == 5:
                    worker.start()
                if tokenized:
                    break  # the tokenize answered; the stream's disconnect aborts the rest
            worker.join()
    start, end = tokenized
    assert arrivals[-1] >= end, "the stream ended before the tokenize did: nothing measured"
    during = [t for t in arrivals if start <= t <= end]
    gaps = [b - a for a, b in zip([start, *during], [*during, end])]
    print(f"tokenize alone {alone:.2f}s, over HTTP {end - start:.2f}s; {len(during)} chunks meanwhile, "
          f"longest gap {max(gaps):.3f}s")  # fmt: skip
    # Tokenizing on the event loop (or holding the GIL throughout) leaves one gap of at least the
    # tokenization's own time; on two busy cores the engine's steps alone have left gaps of ~0.5x it.
    assert len(during) >= 20 and max(gaps) < 0.8 * alone, "the stream stalled while /tokenize ran"
