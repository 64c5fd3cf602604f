"""OpenAI fields kvserve does not use, through the official client: each is ignored or refused on purpose."""

from __future__ import annotations

import openai
import pytest

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "Name a color."}]
GREEDY = {"model": MODEL, "max_tokens": 6, "temperature": 0}


def test_chat_fields_that_change_nothing_are_accepted_and_ignored(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(messages=MESSAGES, **GREEDY)
    dressed = client.chat.completions.create(
        messages=MESSAGES, user="user-1", store=False, metadata={"team": "a"}, service_tier="auto",
        parallel_tool_calls=False, response_format={"type": "text"}, tool_choice="none", modalities=["text"],
        prediction={"type": "content", "content": "Blue"}, stream_options=None, **GREEDY,
        extra_body={"prompt_cache_key": "k", "safety_identifier": "s", "functions": [], "function_call": "auto"},
    )  # fmt: skip
    assert dressed.choices[0].message.content == plain.choices[0].message.content
    assert dressed.usage == plain.usage


def test_completion_fields_that_change_nothing_are_accepted(client: openai.OpenAI) -> None:
    plain = client.completions.create(prompt="Paris is", n=2, **GREEDY)
    dressed = client.completions.create(prompt="Paris is", n=2, best_of=2, suffix="", user="u", **GREEDY)
    assert [c.text for c in dressed.choices] == [c.text for c in plain.choices]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"reasoning_effort": "low"}, "reasoning_effort"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"extra_body": {"functions": [{"name": "f"}]}}, "functions"),
    ],
)
def test_chat_fields_kvserve_cannot_honour_are_400s_naming_them(client: openai.OpenAI, fields, param) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(messages=MESSAGES, **GREEDY, **fields)
    assert raised.value.body["param"] == param and raised.value.body["code"] == "unsupported_field"


@pytest.mark.parametrize(("fields", "param"), [({"best_of": 3}, "best_of"), ({"suffix": " The end."}, "suffix")])
def test_completion_fields_kvserve_cannot_honour_are_400s(client: openai.OpenAI, fields, param) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(prompt="Paris is", **GREEDY, **fields)
    assert raised.value.body["param"] == param
