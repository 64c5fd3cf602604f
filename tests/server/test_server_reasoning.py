"""Reasoning outputs (``--reasoning-parser``) through the ``openai`` client, on the embedded SmolLM2.

SmolLM2 does not think on its own; two worked turns in the conversation teach it to, so at
temperature 0 it answers ``<think>…</think>`` then the answer. Servers with and without a
parser share one engine: the parser-less one gives the raw text each split is checked against.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest
from typer.testing import CliRunner

from kvserve.cli import serve  # noqa: F401  (registers the command)
from kvserve.cli.app import app
from kvserve.config import EngineConfig, ServerConfig
from kvserve.errors import UnknownComponentError
from kvserve.frontend.async_llm import AsyncLLM
from kvserve.reasoning import load_reasoning_parser
from kvserve.server import ServerThread, build_app

CONVERSATION = [
    {"role": "user", "content": "What is the capital of Italy?"},
    {"role": "assistant", "content": "<think>Italy's capital is Rome.</think>Rome"},
    {"role": "user", "content": "What is the capital of Spain?"},
    {"role": "assistant", "content": "<think>Spain's capital is Madrid.</think>Madrid"},
    {"role": "user", "content": "What is the capital of France?"},
]
ARGS = dict(model="smol", messages=CONVERSATION, max_tokens=40, temperature=0)
PARSERS = ["qwen3", "deepseek_r1"]


@pytest.fixture(scope="module")
def llm() -> Iterator[AsyncLLM]:
    engine = AsyncLLM.from_config(EngineConfig.from_flat(dtype="float32", max_model_len=512))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def urls(llm: AsyncLLM) -> Iterator[dict[str | None, str]]:
    """Parser name (None: no parser) -> the base URL of a server over ``llm`` with it."""
    servers = {
        name: ServerThread(build_app(llm, ServerConfig(port=0, reasoning_parser=name), "smol"))
        for name in [None, *PARSERS]
    }
    for server in servers.values():
        server.__enter__()
    try:
        yield {name: server.url for name, server in servers.items()}
    finally:
        for server in servers.values():
            server.__exit__(None, None, None)


def client(urls: dict[str | None, str], parser: str | None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{urls[parser]}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def raw(urls: dict[str | None, str]) -> str:
    """The model's whole answer, as a server without a reasoning parser returns it."""
    text = client(urls, None).chat.completions.create(**ARGS).choices[0].message.content
    assert text.startswith("<think>") and "</think>" in text, f"SmolLM2 no longer follows the worked turns: {text!r}"
    return text


def test_without_a_parser_the_answer_is_unchanged(urls, raw):
    with httpx.Client(base_url=urls[None], timeout=60) as http:
        message = http.post("/v1/chat/completions", json=ARGS).json()["choices"][0]["message"]
        assert "reasoning_content" not in message and message["content"] == raw
        lines = http.post("/v1/chat/completions", json={**ARGS, "stream": True}).text.splitlines()
    deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in lines if line.startswith("data: {")]
    assert all("reasoning_content" not in delta for delta in deltas)
    assert "".join(delta["content"] or "" for delta in deltas) == raw


@pytest.mark.parametrize("parser", PARSERS)
def test_the_reasoning_comes_apart_from_the_answer(urls, raw, llm, parser):
    message = client(urls, parser).chat.completions.create(**ARGS).choices[0].message
    reasoning, content = load_reasoning_parser(parser, llm.tokenizer).extract_reasoning(raw)
    assert (message.reasoning_content, message.content) == (reasoning, content)
    assert "Paris" in reasoning and content and "think>" not in reasoning + content


@pytest.mark.parametrize("parser", PARSERS)
def test_streamed_reasoning_and_content_deltas_join_to_the_whole_answer(urls, parser):
    openai_client = client(urls, parser)
    whole = openai_client.chat.completions.create(**ARGS).choices[0].message
    chunks = [c for c in openai_client.chat.completions.create(**ARGS, stream=True) if c.choices]
    deltas = [c.choices[0].delta for c in chunks]
    reasoning = [i for i, d in enumerate(deltas) if getattr(d, "reasoning_content", None)]
    content = [i for i, d in enumerate(deltas) if d.content]
    assert "".join(deltas[i].reasoning_content for i in reasoning) == whole.reasoning_content
    assert "".join(deltas[i].content for i in content) == whole.content
    assert reasoning and content and max(reasoning) < min(content)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_qwen3_with_thinking_off_answers_in_content(urls, raw):
    off = {"chat_template_kwargs": {"enable_thinking": False}}  # SmolLM2's template ignores it: same raw text
    message = client(urls, "qwen3").chat.completions.create(**ARGS, extra_body=off).choices[0].message
    assert (message.reasoning_content, message.content) == (None, raw)


def test_chat_template_kwargs_may_not_set_the_template_call_arguments(urls):
    with pytest.raises(openai.BadRequestError) as caught:
        client(urls, "qwen3").chat.completions.create(**ARGS, extra_body={"chat_template_kwargs": {"tokenize": True}})
    error = caught.value.body
    assert error["param"] == "chat_template_kwargs" and "'tokenize' is an argument" in error["message"]


def test_an_unknown_parser_stops_the_server_from_starting(llm):
    with pytest.raises(UnknownComponentError, match="unknown reasoning parser 'nope'; available: deepseek_r1, qwen3"):
        build_app(llm, ServerConfig(port=0, reasoning_parser="nope"))


def test_the_command_line_option_sets_the_server_config(monkeypatch):
    started = {}
    monkeypatch.setattr("kvserve.server.runner.serve", lambda config, log_level: started.update(config=config))
    result = CliRunner().invoke(app, ["serve", "--reasoning-parser", "deepseek_r1"])
    assert result.exit_code == 0, result.output
    assert started["config"].server.reasoning_parser == "deepseek_r1"
