"""Calls forced by a grammar, on the embedded SmolLM2 through the server and the official ``openai`` client:
``tool_choice="required"`` and a named function give calls whose arguments validate against the tool's
parameters (``jsonschema``), sampled at temperature 0.9 over many seeds, streamed and not.

The grammar needs a structured-output backend: these tests skip until ``xgrammar`` is installed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import openai
import pytest

from kvserve.config import EngineConfig, ServerConfig
from kvserve.frontend.async_llm import AsyncLLM
from kvserve.loader.default_model import EMBEDDED_MODEL_NAME
from kvserve.server import ServerThread, build_app
from kvserve.testing.contracts.tool_parser import WEATHER_TOOLS

pytest.importorskip("xgrammar", reason="a grammar needs a structured-output backend: pip install xgrammar")

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [*WEATHER_TOOLS, ADD]
PARAMETERS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
QUESTION = [{"role": "user", "content": "What is the weather in Paris, and what is 2 + 3?"}]
SEEDS = range(12)


@pytest.fixture(scope="module")
def smol() -> Iterator[openai.OpenAI]:
    llm = AsyncLLM.from_config(EngineConfig.from_flat(dtype="float32", max_model_len=1024))
    try:
        with ServerThread(build_app(llm, ServerConfig(port=0))) as server:
            yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    finally:
        llm.shutdown()


def ask(client: openai.OpenAI, stream: bool, **fields) -> tuple[list[tuple[str, str]], str | None]:
    """One reply's calls as ``(name, arguments)`` and its finish reason, streamed or not."""
    args = dict(model=EMBEDDED_MODEL_NAME, messages=QUESTION, tools=TOOLS, temperature=0.9, max_tokens=160, **fields)
    if not stream:
        choice = client.chat.completions.create(**args).choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        return calls, choice.finish_reason
    calls: dict[int, list[str]] = {}
    finish = None
    for chunk in client.chat.completions.create(**args, stream=True):
        for call in chunk.choices[0].delta.tool_calls or []:
            if call.id is not None:
                calls[call.index] = [call.function.name, ""]
            calls[call.index][1] += call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return [(name, arguments) for name, arguments in calls.values()], finish


def valid(name: str, arguments: str) -> None:
    jsonschema.validate(json.loads(arguments), PARAMETERS[name])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_required_tool_choice_calls_tools_with_valid_arguments(smol: openai.OpenAI, stream: bool) -> None:
    finished = 0
    for seed in SEEDS:
        calls, finish = ask(smol, stream, tool_choice="required", seed=seed)
        if finish != "tool_calls":
            assert finish == "length", finish
            continue
        finished += 1
        assert calls, f"seed {seed}: required tool choice gave no call"
        for name, arguments in calls:
            valid(name, arguments)
    assert finished >= len(SEEDS) * 2 // 3, f"only {finished} of {len(SEEDS)} replies finished"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_named_function_is_called_with_valid_arguments(smol: openai.OpenAI, stream: bool) -> None:
    finished = 0
    for seed in SEEDS:
        choice = {"type": "function", "function": {"name": "add"}}
        calls, finish = ask(smol, stream, tool_choice=choice, seed=seed)
        assert [name for name, _ in calls] == ["add"]
        if finish == "stop":  # a named function keeps OpenAI's "stop"
            finished += 1
            valid(*calls[0])
    assert finished >= len(SEEDS) * 2 // 3, f"only {finished} of {len(SEEDS)} replies finished"


def test_required_without_parallel_calls_makes_one_call(smol: openai.OpenAI) -> None:
    for seed in SEEDS[:4]:
        calls, finish = ask(smol, False, tool_choice="required", parallel_tool_calls=False, seed=seed)
        if finish == "tool_calls":
            assert len(calls) == 1
            valid(*calls[0])
