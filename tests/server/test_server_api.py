"""The OpenAI-compatible API through the official ``openai`` client and raw HTTP, on a real server."""

from __future__ import annotations

import json

import httpx
import openai

import kvserve
from kvserve.server.protocol import ChatCompletionRequest, CompletionRequest

MODEL = "tiny"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}]


def test_models_health_and_version(client: openai.OpenAI, http: httpx.Client) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert http.get("/health").json() == {"status": "ok"}
    assert http.get("/version").json() == {"version": kvserve.__version__}


def test_completion_with_usage(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=8, temperature=0)
    assert out.object == "text_completion" and out.model == MODEL
    assert len(out.choices) == 1 and out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 8
    assert out.usage.total_tokens == out.usage.prompt_tokens + 8


def test_every_prompt_form_gets_its_choices(client: openai.OpenAI, http: httpx.Client) -> None:
    ids = http.post("/tokenize", json={"prompt": "Paris is"}).json()["tokens"]
    text = client.completions.create(model=MODEL, prompt="Paris is", max_tokens=6, temperature=0).choices[0].text
    for prompt in (ids, [ids, ids], ["Paris is", "Paris is"]):
        out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0)
        assert [c.text for c in out.choices] == [text] * (1 if prompt is ids else 2)
        assert [c.index for c in out.choices] == list(range(len(out.choices)))


def test_completion_logprobs_and_echo(client: openai.OpenAI) -> None:
    prompt = "Paged attention"
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0, logprobs=3, echo=True)
    choice = out.choices[0]
    lp = choice.logprobs
    assert choice.text.startswith(prompt)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert len(lp.tokens) == out.usage.prompt_tokens + out.usage.completion_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing predicts the first token
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    for token, logprob, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:]):
        assert logprob <= 0 and top[token] == logprob and 1 <= len(top) <= 4
    for i in range(out.usage.prompt_tokens, len(lp.tokens)):  # greedy: each generated token is the likeliest
        assert lp.token_logprobs[i] == max(lp.top_logprobs[i].values())


def test_chat_and_its_logprobs(client: openai.OpenAI, http: httpx.Client) -> None:
    out = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2
    )
    choice = out.choices[0]
    assert out.object == "chat.completion" and choice.message.role == "assistant"
    prompt = http.post("/tokenize", json={"messages": MESSAGES}).json()
    assert out.usage.prompt_tokens == prompt["count"] and out.usage.completion_tokens == 6
    content = choice.logprobs.content
    assert len(content) == 6
    for token in content:
        assert len(token.top_logprobs) == 2
        assert token.top_logprobs[0].logprob >= token.top_logprobs[1].logprob
        assert token.logprob == token.top_logprobs[0].logprob  # greedy picks the most likely token
        assert bytes(token.bytes).decode() == token.token


def test_streamed_chat_equals_non_streamed_for_the_same_seed(client: openai.OpenAI) -> None:
    args = dict(model=MODEL, messages=MESSAGES, max_tokens=16, temperature=1.0, seed=1234)
    whole = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_n_2_gives_two_seeded_choices_streamed_or_not(client: openai.OpenAI) -> None:
    args = dict(model=MODEL, messages=MESSAGES, max_tokens=10, temperature=1.0, seed=7, n=2)
    whole = client.chat.completions.create(**args)
    assert [c.index for c in whole.choices] == [0, 1]
    assert whole.choices[0].message.content != whole.choices[1].message.content
    assert whole.usage.completion_tokens == 20
    texts = ["", ""]
    for chunk in client.chat.completions.create(**args, stream=True):
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == [c.message.content for c in whole.choices]


def test_stop_string_ends_the_text_before_it(client: openai.OpenAI) -> None:
    args = dict(model=MODEL, prompt="Continuous batching", max_tokens=32, temperature=0)
    full = client.completions.create(**args).choices[0].text
    stop = next(char for char in full[3:] if char.isalnum())
    stopped = client.completions.create(**args, stop=[stop]).choices[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop
    assert stopped.text == full[: full.index(stop)]
    streamed = client.completions.create(**args, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == stopped.text


def test_streamed_completion_ends_with_done_over_raw_sse(http: httpx.Client) -> None:
    # Sampled at the default temperature: without ignore_eos the tiny model ends early about once in 300.
    body = {"model": MODEL, "prompt": "The", "max_tokens": 4, "stream": True, "logprobs": 1, "ignore_eos": True}
    with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert sum(len(c["choices"][0]["logprobs"]["tokens"]) for c in chunks) == 4
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_max_completion_tokens_and_priority(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_completion_tokens=3, temperature=0, extra_body={"priority": -1}
    )
    assert out.usage.completion_tokens == 3 and out.choices[0].finish_reason == "length"


def test_tokenize_detokenize_round_trip(http: httpx.Client) -> None:
    tokens = http.post("/tokenize", json={"prompt": "Berlin is the capital", "add_special_tokens": False}).json()
    assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == 1024
    assert http.post("/detokenize", json={"tokens": tokens["tokens"]}).json() == {"prompt": "Berlin is the capital"}


def test_metrics_expose_engine_and_request_series(client: openai.OpenAI, http: httpx.Client, metrics) -> None:
    # Sampled at the default temperature: without ignore_eos the request may stop (finished_reason="stop")
    # and, run alone, leave no finished_reason="length" series.
    client.completions.create(model=MODEL, prompt="metrics", max_tokens=3, extra_body={"ignore_eos": True})
    samples = metrics(http)
    for name in (
        "kvserve:num_requests_running", "kvserve:num_requests_waiting", "kvserve:kv_cache_usage_perc",
        "kvserve:kv_cache_free_blocks", "kvserve:prefix_cache_hit_rate", "kvserve:num_preemptions_total",
        "kvserve:prompt_tokens_total", "kvserve:generation_tokens_total", "kvserve:time_to_first_token_seconds_count",
        "kvserve:inter_token_latency_seconds_count", 'kvserve:request_success_total{finished_reason="length"}',
        'kvserve:http_requests_total{path="/v1/completions",status="200"}',
    ):  # fmt: skip
        assert name in samples, name
    assert samples["kvserve:time_to_first_token_seconds_count"] >= 1


def test_chat_without_max_tokens_may_use_the_whole_context() -> None:
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}])
    assert request.sampling_params({}).max_tokens is None  # as OpenAI: up to the context length, not 16
    assert CompletionRequest(prompt="hi").sampling_params({}).max_tokens == 16  # the legacy default
