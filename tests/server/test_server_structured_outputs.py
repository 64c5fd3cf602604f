"""Structured-output request fields: every spelling vLLM accepts becomes ``SamplingParams.structured_outputs``,
and a bad one is a 400 naming the field while the server goes on serving.

Whether the output then follows the constraint is the engine's part (``tests/test_structured_outputs_server.py``
runs that on SmolLM2 once a backend is installed); here the engine's check is a spy that records what
reached it.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from kvserve.frontend.async_llm import AsyncLLM
from kvserve.sampling_params import SamplingParams
from kvserve.server.errors import OpenAIError, engine_error
from kvserve.server.protocol import ChatCompletionRequest, CompletionRequest, GenerationRequest
from kvserve.structured_outputs import StructuredOutputsParams

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "Name a color."}]
SCHEMA = {"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"]}
JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "color", "schema": SCHEMA, "strict": True}}

# (request fields, the StructuredOutputsParams they mean)
FORMS: list[tuple[dict[str, Any], dict[str, Any] | None]] = [
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, {"json_object": True}),
    ({"response_format": JSON_SCHEMA_FORMAT}, {"json": SCHEMA}),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "c", "description": "d", "schema": {}}}},
        {"json": {}},
    ),
    (
        {"response_format": {"type": "structural_tag", "format": {"type": "regex", "pattern": "a+"}}},
        {"structural_tag": '{"type":"structural_tag","format":{"type":"regex","pattern":"a+"}}'},
    ),
    (
        {
            "response_format": {
                "type": "structural_tag",
                "structures": [{"begin": "<f>", "end": "</f>"}],
                "triggers": ["<f"],
            }
        },
        {"structural_tag": '{"type":"structural_tag","structures":[{"begin":"<f>","end":"</f>"}],"triggers":["<f"]}'},
    ),
    ({"structured_outputs": {"json": SCHEMA}}, {"json": SCHEMA}),
    ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, {"json": json.dumps(SCHEMA)}),
    ({"structured_outputs": {"json_object": True}}, {"json_object": True}),
    ({"structured_outputs": {"regex": "[a-z]+"}}, {"regex": "[a-z]+"}),
    ({"structured_outputs": {"choice": ["red", "blue"]}}, {"choice": ["red", "blue"]}),
    ({"structured_outputs": {"grammar": 'root ::= "red"'}}, {"grammar": 'root ::= "red"'}),
    ({"structured_outputs": {"structural_tag": '{"type": "x"}'}}, {"structural_tag": '{"type": "x"}'}),
    (
        {"structured_outputs": {"regex": "a+", "disable_any_whitespace": True, "whitespace_pattern": " "}},
        {"regex": "a+", "disable_any_whitespace": True, "whitespace_pattern": " "},
    ),
    (  # options in structured_outputs apply to a constraint set elsewhere, as vLLM merges them
        {"response_format": JSON_SCHEMA_FORMAT, "structured_outputs": {"disable_additional_properties": True}},
        {"json": SCHEMA, "disable_additional_properties": True},
    ),
    ({"structured_outputs": {"json_object": False, "choice": ["a"]}}, {"choice": ["a"]}),  # false is unset
    ({"guided_json": SCHEMA}, {"json": SCHEMA}),
    (
        {"guided_json": json.dumps(SCHEMA), "guided_whitespace_pattern": "[ ]?"},
        {"json": json.dumps(SCHEMA), "whitespace_pattern": "[ ]?"},
    ),
    ({"guided_regex": "[0-9]{4}"}, {"regex": "[0-9]{4}"}),
    ({"guided_choice": ["yes", "no"]}, {"choice": ["yes", "no"]}),
    ({"guided_grammar": 'root ::= "a"'}, {"grammar": 'root ::= "a"'}),
    ({"structural_tag": '{"type": "x"}'}, {"structural_tag": '{"type": "x"}'}),
    ({"guided_regex": None, "structured_outputs": None, "response_format": None}, None),
]

# (request fields, the param of the 400, words its message must hold)
BAD: list[tuple[dict[str, Any], str, list[str]]] = [
    (
        {"response_format": JSON_SCHEMA_FORMAT, "guided_regex": "a+"},
        "response_format",
        ["response_format", "guided_regex"],
    ),
    (
        {"response_format": {"type": "json_object"}, "structured_outputs": {"choice": ["a"]}},
        "response_format",
        ["response_format", "structured_outputs.choice"],
    ),
    (
        {"structured_outputs": {"regex": "a", "choice": ["a"]}},
        "structured_outputs",
        ["structured_outputs.regex", "structured_outputs.choice"],
    ),
    ({"guided_json": SCHEMA, "guided_choice": ["a"]}, "guided_json", ["guided_json", "guided_choice"]),
    (
        {"structured_outputs": {"json": SCHEMA}, "guided_grammar": "root ::= 'a'"},
        "structured_outputs",
        ["structured_outputs.json", "guided_grammar"],
    ),
    ({"guided_choice": []}, "guided_choice", ["guided_choice"]),
    ({"structured_outputs": {"choice": []}}, "structured_outputs", ["structured_outputs.choice"]),
    ({"guided_choice": ["a", ""]}, "guided_choice", ["guided_choice"]),
    ({"structured_outputs": {"choice": [1, 2]}}, "structured_outputs", ["structured_outputs.choice"]),
    ({"structured_outputs": {}}, "structured_outputs", ["no constraint"]),
    ({"structured_outputs": {"disable_any_whitespace": True}}, "structured_outputs", ["no constraint"]),
    (
        {"structured_outputs": {"regex": "a", "bogus": 1}},
        "structured_outputs",
        ["structured_outputs.bogus", "unknown field"],
    ),
    ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern", ["no constraint"]),
    ({"guided_json": "{not json"}, "guided_json", ["guided_json", "not valid JSON"]),
    (
        {"structured_outputs": {"json": "{not json"}},
        "structured_outputs",
        ["structured_outputs.json", "not valid JSON"],
    ),
    (
        {"guided_decoding_backend": "xgrammar", "guided_regex": "a"},
        "guided_decoding_backend",
        ["--structured-outputs-config"],
    ),
    ({"response_format": {"type": "json_schema"}}, "response_format", ["json_schema"]),
    (
        {"response_format": {"type": "text", "json_schema": JSON_SCHEMA_FORMAT["json_schema"]}},
        "response_format",
        ["text"],
    ),
    ({"response_format": {"type": "structural_tag", "triggers": ["<f"]}}, "response_format", ["structures"]),
]

# Bodies of the wrong shape: 422 naming the field, as for every other field.
WRONG_SHAPE: list[tuple[dict[str, Any], str]] = [
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),  # no schema
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "response_format"),  # no name
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strict": "yes"}}},
        "response_format",
    ),
    ({"structured_outputs": ["choice"]}, "structured_outputs"),
    ({"guided_choice": "yes"}, "guided_choice"),
    ({"guided_regex": 5}, "guided_regex"),
]


def _body(endpoint: str, fields: dict[str, Any], stream: bool = False) -> dict[str, Any]:
    base = {"prompt": "Name a color:"} if endpoint == "completions" else {"messages": MESSAGES}
    return {"model": MODEL, **base, "max_tokens": 4, "stream": stream, **fields}


def _params(endpoint: str, fields: dict[str, Any], stream: bool) -> SamplingParams:
    """What the server makes of the body: parsed as it parses it, then converted."""
    model: type[GenerationRequest] = CompletionRequest if endpoint == "completions" else ChatCompletionRequest
    return model.model_validate_json(json.dumps(_body(endpoint, fields, stream))).sampling_params({})


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize(("fields", "expected"), FORMS)
def test_each_form_becomes_structured_outputs(endpoint: str, stream: bool, fields: dict, expected: dict | None) -> None:
    params = _params(endpoint, fields, stream)
    assert params.structured_outputs == (None if expected is None else StructuredOutputsParams(**expected))


@pytest.mark.parametrize(("fields", "param", "words"), BAD)
def test_bad_forms_are_400s_naming_the_fields_in_conversion(fields: dict, param: str, words: list[str]) -> None:
    for endpoint in ("completions", "chat"):
        with pytest.raises(OpenAIError) as raised:
            _params(endpoint, fields, stream=False)
        assert (raised.value.status, raised.value.param) == (400, param), raised.value.message
        assert all(word in raised.value.message for word in words), raised.value.message


def test_engine_errors_name_the_field_the_client_used() -> None:
    """The engine names the constraint ``structured_outputs.<kind>``; the client hears its own field."""
    regex = CompletionRequest.model_validate({"prompt": "x", "guided_regex": "("})
    error = engine_error(ValueError("structured_outputs.regex: missing )"), regex.constraint_renames())
    assert (error.status, error.param, error.message) == (400, "guided_regex", "guided_regex: missing )")
    schema = ChatCompletionRequest.model_validate({"messages": MESSAGES, "response_format": JSON_SCHEMA_FORMAT})
    error = engine_error(ValueError("structured_outputs.json: unsupported keyword"), schema.constraint_renames())
    assert error.param == "response_format"
    assert error.message == "response_format.json_schema.schema: unsupported keyword"
    own = CompletionRequest.model_validate({"prompt": "x", "structured_outputs": {"grammar": "?"}})
    error = engine_error(ValueError("structured_outputs.grammar: bad rule"), own.constraint_renames())
    assert (error.param, error.message) == ("structured_outputs", "structured_outputs.grammar: bad rule")
    assert engine_error(ValueError("n: 9 completions exceed max_n=8")).param == "n"  # the others unchanged


@pytest.fixture
def reached(served_llm: AsyncLLM, monkeypatch: pytest.MonkeyPatch) -> list[StructuredOutputsParams | None]:
    """The constraint of each prompt the server hands the engine; the engine then runs it unconstrained (or
    refuses it as a backend would, for a ``regex`` of ``(``), so these tests need no backend."""
    seen: list[StructuredOutputsParams | None] = []
    check = served_llm.validate_prompt

    def spy(prompt_token_ids: list[int], params: SamplingParams, **kwargs: Any) -> Any:
        seen.append(params.structured_outputs)
        if params.structured_outputs is not None and params.structured_outputs.regex == "(":
            raise ValueError("structured_outputs.regex: missing ), unterminated subpattern at position 0")
        return check(prompt_token_ids, params.model_copy(update={"structured_outputs": None}), **kwargs)

    monkeypatch.setattr(served_llm, "validate_prompt", spy)
    return seen


def _chat(client: openai.OpenAI, stream: bool, **fields: Any) -> str:
    """The reply's text, streamed or not."""
    args = dict(model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0)
    if not stream:
        return client.chat.completions.create(**args, **fields).choices[0].message.content
    chunks = client.chat.completions.create(**args, **fields, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


@pytest.mark.parametrize("stream", [False, True])
def test_the_official_client_reaches_the_engine_with_each_form(
    client: openai.OpenAI, reached: list, stream: bool
) -> None:
    _chat(client, stream, response_format=JSON_SCHEMA_FORMAT)
    _chat(client, stream, response_format={"type": "json_object"})
    _chat(client, stream, extra_body={"structured_outputs": {"choice": ["red", "blue"]}})
    _chat(client, stream, extra_body={"guided_regex": "[a-z]+"})
    args = dict(model=MODEL, prompt=["Name a color:", "Another:"], max_tokens=4, stream=stream)
    out = client.completions.create(**args, extra_body={"guided_choice": ["red", "blue"]})
    if stream:
        list(out)
    assert reached == [
        StructuredOutputsParams(json=SCHEMA),
        StructuredOutputsParams(json_object=True),
        StructuredOutputsParams(choice=["red", "blue"]),
        StructuredOutputsParams(regex="[a-z]+"),
        *[StructuredOutputsParams(choice=["red", "blue"])] * 2,  # each prompt
    ]


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_bad_forms_over_http_are_400s_and_the_server_goes_on(http: httpx.Client, reached: list, endpoint: str) -> None:
    path = "/v1/completions" if endpoint == "completions" else "/v1/chat/completions"
    for i, (fields, param, words) in enumerate(BAD):
        response = http.post(path, json=_body(endpoint, fields, stream=i % 2 == 1))
        error = response.json()["error"]
        assert (response.status_code, error["param"]) == (400, param), (fields, error)
        assert all(word in error["message"] for word in words), error
        assert set(error) == {"message", "type", "param", "code"} and "Traceback" not in response.text
    for fields, param in WRONG_SHAPE:
        response = http.post(path, json=_body(endpoint, fields))
        assert (response.status_code, response.json()["error"]["param"]) == (422, param), (fields, response.text)
    assert reached == [], "no bad request reached the engine"
    response = http.post(path, json=_body(endpoint, {"guided_regex": "("}))  # the engine's (a backend's) refusal
    assert (response.status_code, response.json()["error"]["param"]) == (400, "guided_regex"), response.text
    assert response.json()["error"]["message"].startswith("guided_regex: missing )")
    response = http.post(path, json=_body(endpoint, {"guided_regex": "[a-z]+"}))
    assert response.status_code == 200 and response.json()["choices"], response.text


def test_the_official_client_raises_bad_request_naming_both_fields(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=4, response_format={"type": "json_object"},
            extra_body={"guided_choice": ["a", "b"]},
        )  # fmt: skip
    assert raised.value.body["param"] == "response_format"
    assert "response_format" in raised.value.message and "guided_choice" in raised.value.message
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(
            model=MODEL, prompt="x", max_tokens=4, extra_body={"structured_outputs": {"choice": []}}
        )
    assert raised.value.body["param"] == "structured_outputs" and "structured_outputs.choice" in raised.value.message
