"""Structured outputs end to end: the embedded SmolLM2 served, sampled at temperature 0.8-1.0 over several
seeds, through the official ``openai`` client, streamed and not.

Every output that finishes with ``finish_reason="stop"`` (a grammar that has ended stops its request)
matches its constraint, and most finish: JSON schemas validate with ``jsonschema``, choices are one of
the choices, regexes match in full. A constraint the backend cannot compile is a 400 naming the field
the client set it in, and the server goes on serving. Each installed backend in turn (xgrammar,
guidance); skipped while none is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel

from kvserve.config import EngineConfig, ServerConfig
from kvserve.frontend.async_llm import AsyncLLM
from kvserve.loader.default_model import EMBEDDED_MODEL_NAME
from kvserve.server import ServerThread, build_app
from kvserve.structured_outputs.selection import usable_backends

pytestmark = pytest.mark.skipif(
    not usable_backends(), reason="no structured output backend installed (xgrammar, guidance)"
)

SEEDS = [1, 2, 3]
N = 3  # samples per request: seed, seed + 1, seed + 2
TEMPERATURES = [0.8, 1.0]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 20},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
DESCRIBE = [{"role": "user", "content": "Describe a person as JSON with a name, an age and a city."}]
NO_SPACE = {"structured_outputs": {"disable_any_whitespace": True}}
"""Merged into any constraint (vLLM's spelling): small models loop on whitespace otherwise."""


Outputs = list[tuple[str, str]]
"""(text, finish_reason) of each choice."""


@pytest.fixture(scope="module", params=usable_backends())
def smol(request: pytest.FixtureRequest) -> Iterator[openai.OpenAI]:
    """The server with each installed backend in turn (``structured_outputs_config.backend``)."""
    config = EngineConfig.from_flat(
        dtype="float32", max_model_len=1024, structured_outputs_config={"backend": request.param}
    )
    llm = AsyncLLM.from_config(config)
    try:
        with ServerThread(build_app(llm, ServerConfig(port=0))) as server:
            yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    finally:
        llm.shutdown()


def chat(client: openai.OpenAI, stream: bool, **args: Any) -> Outputs:
    """(text, finish_reason) of each choice, streamed or not."""
    args = {"model": EMBEDDED_MODEL_NAME, "n": N, **args}
    if not stream:
        return [(c.message.content, c.finish_reason) for c in client.chat.completions.create(**args).choices]
    texts: dict[int, str] = {}
    reasons: dict[int, str] = {}
    for chunk in client.chat.completions.create(**args, stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            reasons[choice.index] = choice.finish_reason or reasons.get(choice.index)
    return [(texts[i], reasons[i]) for i in sorted(texts)]


def complete(client: openai.OpenAI, stream: bool, **args: Any) -> Outputs:
    """(text, finish_reason) of each choice of a completions request, streamed or not."""
    args = {"model": EMBEDDED_MODEL_NAME, "n": N, **args}
    if not stream:
        return [(c.text, c.finish_reason) for c in client.completions.create(**args).choices]
    texts: dict[int, str] = {}
    reasons: dict[int, str] = {}
    for chunk in client.completions.create(**args, stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            reasons[choice.index] = choice.finish_reason or reasons.get(choice.index)
    return [(texts[i], reasons[i]) for i in sorted(texts)]


def sampled(run: Callable[..., Outputs], client: openai.OpenAI, stream: bool, **args: Any) -> Outputs:
    """Every choice over ``SEEDS`` x ``TEMPERATURES``."""
    return [
        out
        for seed in SEEDS
        for temperature in TEMPERATURES
        for out in run(client, stream, seed=seed, temperature=temperature, **args)
    ]


def finished(outputs: Outputs) -> list[str]:
    """The texts that finished with ``stop``, once at least half did (the rest ran out of ``max_tokens``)."""
    assert {reason for _, reason in outputs} <= {"stop", "length"}, outputs
    done = [text for text, reason in outputs if reason == "stop"]
    assert len(done) >= len(outputs) / 2, f"only {len(done)} of {len(outputs)} finished: {outputs}"
    return done


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_outputs_validate(smol: openai.OpenAI, stream: bool) -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    outputs = sampled(
        chat, smol, stream, messages=DESCRIBE, max_tokens=120, response_format=response_format, extra_body=NO_SPACE
    )
    for text in finished(outputs):
        jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.parametrize("stream", [False, True])
def test_older_guided_json_and_completions_validate(smol: openai.OpenAI, stream: bool) -> None:
    prompt = "A person, as JSON with a name, an age and a city: "
    extra = {"guided_json": PERSON, **NO_SPACE}
    for text in finished(sampled(complete, smol, stream, prompt=prompt, max_tokens=120, extra_body=extra)):
        jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.parametrize("stream", [False, True])
def test_json_object_outputs_are_objects(smol: openai.OpenAI, stream: bool) -> None:
    json_object = {"type": "json_object"}
    outputs = sampled(
        chat, smol, stream, messages=DESCRIBE, max_tokens=120, response_format=json_object, extra_body=NO_SPACE
    )
    for text in finished(outputs):
        assert isinstance(json.loads(text), dict), text


class Person(BaseModel):
    name: str
    age: int


def test_the_clients_parse_helper_gets_a_validated_object(smol: openai.OpenAI) -> None:
    """``chat.completions.parse`` sends the model's schema as a strict ``json_schema`` and parses the reply."""
    parsed = []
    for seed in SEEDS:
        try:
            out = smol.chat.completions.parse(
                model=EMBEDDED_MODEL_NAME, messages=DESCRIBE, response_format=Person, max_tokens=120,
                temperature=0.8, seed=seed, extra_body=NO_SPACE,
            )  # fmt: skip
        except openai.LengthFinishReasonError:  # what parse raises for an answer cut short by max_tokens
            continue
        assert out.choices[0].finish_reason == "stop"
        parsed.append(out.choices[0].message.parsed)
    assert len(parsed) >= len(SEEDS) / 2 and all(isinstance(person, Person) for person in parsed), parsed


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("extra", [{"structured_outputs": {"choice": ["yes", "no"]}}, {"guided_choice": ["yes", "no"]}])
def test_choice_outputs_are_one_of_the_choices(smol: openai.OpenAI, stream: bool, extra: dict) -> None:
    question = [{"role": "user", "content": "Is the sky blue? Answer yes or no."}]
    outputs = sampled(chat, smol, stream, messages=question, max_tokens=10, extra_body=extra)
    assert all(reason == "stop" for _, reason in outputs), outputs  # a choice ends well within max_tokens
    assert {text for text, _ in outputs} <= {"yes", "no"}, outputs


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("field", ["guided_regex", "structured_outputs"])
def test_regex_outputs_match_in_full(smol: openai.OpenAI, stream: bool, field: str) -> None:
    pattern = r"(19|20)[0-9]{2}, in [A-Z][a-z]{1,12}"
    extra = {"guided_regex": pattern} if field == "guided_regex" else {"structured_outputs": {"regex": pattern}}
    prompt = "The first moon landing happened in the year "
    outputs = sampled(complete, smol, stream, prompt=prompt, max_tokens=30, extra_body=extra)
    for text in finished(outputs):
        assert re.fullmatch(pattern, text), text


BAD_TYPE = {"type": "object", "properties": {"a": {"type": "no-such-type"}}}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"guided_regex": "(unclosed"}, "guided_regex"),
        ({"structured_outputs": {"regex": "[z-a]"}}, "structured_outputs"),
        ({"structured_outputs": {"grammar": "root ::= ("}}, "structured_outputs"),
        ({"guided_json": BAD_TYPE}, "guided_json"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": BAD_TYPE}}},
            "response_format",
        ),
    ],
)
def test_a_constraint_the_backend_refuses_is_a_400_and_the_server_goes_on(
    smol: openai.OpenAI, extra: dict, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        smol.chat.completions.create(model=EMBEDDED_MODEL_NAME, messages=DESCRIBE, max_tokens=8, extra_body=extra)
    assert raised.value.body["param"] == param, raised.value.body
    assert raised.value.body["message"].startswith(param), raised.value.body
    answer = complete(smol, False, prompt="Say yes: ", max_tokens=4, extra_body={"guided_choice": ["yes"]})
    assert answer == [("yes", "stop")] * N


def test_a_constraint_that_leaves_no_token_is_a_400_and_the_server_goes_on(smol: openai.OpenAI) -> None:
    """A choice grammar and ``allowed_token_ids`` that share no token: the request's own doing, so a 400
    (found while sampling, before anything was sent), and the engine serves on."""
    extra = {"structured_outputs": {"choice": ["yes", "no"]}, "allowed_token_ids": [0]}
    with pytest.raises(openai.BadRequestError) as raised:
        smol.completions.create(model=EMBEDDED_MODEL_NAME, prompt="Say yes: ", max_tokens=4, extra_body=extra)
    assert "every token is ruled out" in raised.value.body["message"], raised.value.body
    answer = complete(smol, False, prompt="Say yes: ", max_tokens=4, extra_body={"guided_choice": ["yes"]})
    assert answer == [("yes", "stop")] * N
