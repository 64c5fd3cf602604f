"""Tool calling through the real server and the official ``openai`` client: tools and tool messages through
the chat template (one that knows tools, and the fallback for one that does not), ``chat_template_kwargs``,
``tool_choice="auto"`` with a parser registered from a file (streaming and not, ``parallel_tool_calls``,
``finish_reason``), and the 400s. Calls forced by a grammar are in ``tests/test_tool_calling.py``."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from kvserve.sampling_params import SamplingParams
from kvserve.server import ServerThread
from kvserve.server.errors import OpenAIError
from kvserve.server.protocol import ChatCompletionRequest
from kvserve.server.serving_tools import ToolUse
from kvserve.structured_outputs import StructuredOutputsParams
from kvserve.testing.contracts.tool_parser import WEATHER_TOOLS
from kvserve.tool_calling.forced import NamedToolCallParser, RequiredToolCallsParser
from kvserve.tool_calling.mistral import MistralToolParser
from kvserve.tool_calling.schema import required_schema
from kvserve.tool_calling.template import TOOLS_HEADER

MODEL = "tiny"
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
]
TEMPLATE_WITH_TOOLS = (
    "{% if tools %}<tools>{{ tools | tojson }}</tools>\n{% endif %}"
    "{% for m in messages %}<s>{{ m.role }}: {{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}<call>{{ c.function.name }} {{ c.function.arguments | tojson }}</call>"
    "{% endfor %}"
    "{% if m.tool_call_id %} ({{ m.tool_call_id }}){% endif %}</s>\n{% endfor %}"
    "{% if shout %}LOUD {% endif %}{% if add_generation_prompt %}<s>assistant:{% endif %}"
)
PARSER_FILE = '''
import json

from kvserve.interfaces import ToolCallDelta, ToolParser, ToolParserDelta


class RecordEverything(ToolParser):
    """Every reply is a call record(text=<the reply>), then a call done()."""

    name = "record_everything"

    def __init__(self, tokenizer, tools):
        super().__init__(tokenizer, tools)
        self.started = False

    def extract_tool_calls_streaming(self, delta_text):
        piece = json.dumps(delta_text)[1:-1]
        if self.started:
            return ToolParserDelta(tool_calls=[ToolCallDelta(0, arguments=piece)] if piece else [])
        self.started = True
        return ToolParserDelta(tool_calls=[ToolCallDelta(0, "record", '{"text": "' + piece)])

    def finish_streaming(self):
        start = self.extract_tool_calls_streaming("").tool_calls
        return ToolParserDelta(tool_calls=[*start, ToolCallDelta(0, arguments='"}'), ToolCallDelta(1, "done", "{}")])
'''


def prompt_tokens(client: openai.OpenAI, **fields) -> int:
    return client.chat.completions.create(model=MODEL, max_tokens=1, **fields).usage.prompt_tokens


# -- tools and tool messages through the chat template ----------------------------------------------


def test_a_template_that_knows_tools_renders_them_and_the_calls_as_objects(make_server, tiny_llm) -> None:
    tokenizer = tiny_llm.tokenizer
    with make_server(tiny_llm, chat_template=TEMPLATE_WITH_TOOLS) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        sent = prompt_tokens(client, messages=CONVERSATION, tools=WEATHER_TOOLS, tool_choice="none")
        plain = prompt_tokens(client, messages=CONVERSATION[:1])
        shouted = prompt_tokens(client, messages=CONVERSATION[:1], extra_body={"chat_template_kwargs": {"shout": True}})
    conversation = json.loads(json.dumps(CONVERSATION).replace("null", '""'))
    conversation[1]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris"}
    text = tokenizer.apply_chat_template(
        conversation, tools=WEATHER_TOOLS, chat_template=TEMPLATE_WITH_TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert '<call>get_weather {"city": "Paris"}</call>' in text and "<s>tool: 18C (call_1)</s>" in text
    assert sent == len(tokenizer.encode(text, add_special_tokens=False))
    loud = tokenizer.apply_chat_template(
        CONVERSATION[:1], chat_template=TEMPLATE_WITH_TOOLS, add_generation_prompt=True, tokenize=False, shout=True
    )
    assert "LOUD <s>assistant:" in loud and shouted == len(tokenizer.encode(loud, add_special_tokens=False)) > plain


def test_a_template_without_tools_gets_them_in_a_system_message(client: openai.OpenAI, served_llm) -> None:
    # The tiny model's template knows only role and content.
    sent = prompt_tokens(client, messages=CONVERSATION, tools=WEATHER_TOOLS, tool_choice="none")
    tools = "\n".join(json.dumps(tool["function"]) for tool in WEATHER_TOOLS)
    call = json.dumps([{"name": "get_weather", "arguments": {"city": "Paris"}}])
    text = (
        f"<s>system: {TOOLS_HEADER}\n{tools}</s>\n<s>user: Weather in Paris?</s>\n<s>assistant: {call}</s>\n"
        "<s>tool: 18C</s>\n<s>assistant:"
    )
    assert sent == len(served_llm.tokenizer.encode(text, add_special_tokens=False))


def test_template_kwargs_that_are_apply_chat_template_parameters_are_400s(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        prompt_tokens(client, messages=CONVERSATION[:1], extra_body={"chat_template_kwargs": {"tokenize": True}})
    assert raised.value.body["param"] == "chat_template_kwargs" and "'tokenize'" in raised.value.body["message"]


# -- 400s ------------------------------------------------------------------------------------------

NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"tool_choice": "auto"}, "only allowed with tools"),
        ({"tool_choice": "required"}, "only allowed with tools"),
        ({"tool_choice": NAMED}, "only allowed with tools"),
        ({"tools": WEATHER_TOOLS[1:], "tool_choice": NAMED}, "no function named 'get_weather' in tools"),
        ({"tools": WEATHER_TOOLS}, "requires --enable-auto-tool-choice and --tool-call-parser"),
        ({"tools": WEATHER_TOOLS, "tool_choice": "auto"}, "requires --enable-auto-tool-choice"),
    ],
)
def test_tool_choices_the_server_cannot_honour_are_400s(client: openai.OpenAI, fields, words) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL, messages=CONVERSATION[:1], max_tokens=1, **fields)
    assert raised.value.body["param"] == "tool_choice" and words in raised.value.body["message"]


def test_malformed_tools_and_tool_calls_are_422s(client: openai.OpenAI) -> None:
    for fields in (
        {"tools": [{"type": "function", "function": {"description": "no name"}}]},
        {"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f"}}]}]},
    ):
        with pytest.raises(openai.UnprocessableEntityError):
            client.chat.completions.create(**{"model": MODEL, "messages": CONVERSATION[:1], "max_tokens": 1, **fields})


# -- tool_choice="auto" ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def auto_server(tmp_path_factory, tiny_llm, make_server) -> Iterator[ServerThread]:
    """A server whose auto tool choice reads calls with a parser registered from a file."""
    file = Path(tmp_path_factory.mktemp("parser")) / "record_parser.py"
    file.write_text(textwrap.dedent(PARSER_FILE))
    with make_server(
        tiny_llm, enable_auto_tool_choice=True, tool_call_parser="record_everything", tool_parser_plugin=str(file)
    ) as server:
        yield server


@pytest.fixture(scope="module")
def forced(tiny_llm) -> dict:
    """Sampling fields that make the tiny model write a letter three times, then stop."""
    token = next(t for t in range(3, 384) if tiny_llm.tokenizer.decode([t]).isalpha())
    letter = tiny_llm.tokenizer.decode([token])
    return {"stop": [letter * 3], "extra_body": {"allowed_token_ids": [token], "include_stop_str_in_output": True}}


def test_auto_tool_choice_reads_calls_whole_and_streamed(auto_server: ServerThread, forced: dict) -> None:
    client = openai.OpenAI(base_url=f"{auto_server.url}/v1", api_key="unused", max_retries=0)
    args = dict(model=MODEL, messages=CONVERSATION, tools=WEATHER_TOOLS, max_tokens=8, temperature=0, **forced)
    whole = client.chat.completions.create(**args).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None
    record, done = whole.message.tool_calls
    text = json.loads(record.function.arguments)["text"]
    assert record.function.name == "record" and len(text) == 3 and text == text[0] * 3
    assert (done.function.name, done.function.arguments) == ("done", "{}")
    assert record.id != done.id and record.type == "function"
    # The reply's message goes back into the conversation as the client gives it, with the tools' results.
    results = [{"role": "tool", "tool_call_id": call.id, "content": "ok"} for call in whole.message.tool_calls]
    follow_up = client.chat.completions.create(**{**args, "messages": [*CONVERSATION, whole.message, *results]})
    assert follow_up.usage.prompt_tokens > client.chat.completions.create(**args).usage.prompt_tokens

    chunks = list(client.chat.completions.create(**args, stream=True))
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for call in chunk.choices[0].delta.tool_calls or []:
            if call.id is not None:
                assert call.index not in calls and call.type == "function"
                calls[call.index] = {"id": call.id, "name": call.function.name, "arguments": ""}
            calls[call.index]["arguments"] += call.function.arguments or ""
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        ("record", record.function.arguments),
        ("done", "{}"),
    ]
    assert [c.choices[0].finish_reason for c in chunks][-1] == "tool_calls"
    assert not any(c.choices[0].delta.content for c in chunks)


def test_parallel_tool_calls_false_keeps_the_first_call(auto_server: ServerThread, forced: dict) -> None:
    client = openai.OpenAI(base_url=f"{auto_server.url}/v1", api_key="unused", max_retries=0)
    args = dict(
        model=MODEL, messages=CONVERSATION, tools=WEATHER_TOOLS, max_tokens=8, temperature=0, **forced,
        parallel_tool_calls=False,
    )  # fmt: skip
    assert [c.function.name for c in client.chat.completions.create(**args).choices[0].message.tool_calls] == ["record"]
    streamed = client.chat.completions.create(**args, stream=True)
    assert {call.index for chunk in streamed for call in chunk.choices[0].delta.tool_calls or []} == {0}


def test_each_choice_has_its_own_calls_and_a_cut_reply_keeps_length(auto_server: ServerThread) -> None:
    client = openai.OpenAI(base_url=f"{auto_server.url}/v1", api_key="unused", max_retries=0)
    out = client.chat.completions.create(
        model=MODEL,
        messages=CONVERSATION,
        tools=WEATHER_TOOLS,
        max_tokens=5,
        n=3,
        seed=1,
        extra_body={"ignore_eos": True},
    )
    for choice in out.choices:
        assert choice.finish_reason == "length", "only a reply that stopped by itself says tool_calls"
        record = json.loads(choice.message.tool_calls[0].function.arguments)
        assert [c.function.name for c in choice.message.tool_calls] == ["record", "done"] and record["text"]
    assert len({c.message.tool_calls[0].function.arguments for c in out.choices}) > 1, "three samples, three texts"


def test_tool_choice_none_on_an_auto_server_is_plain_text(auto_server: ServerThread, forced: dict) -> None:
    client = openai.OpenAI(base_url=f"{auto_server.url}/v1", api_key="unused", max_retries=0)
    out = client.chat.completions.create(
        model=MODEL, messages=CONVERSATION, tools=WEATHER_TOOLS, tool_choice="none", max_tokens=8, **forced
    ).choices[0]
    assert out.finish_reason == "stop" and out.message.tool_calls is None and out.message.content


# -- how a request's tool choice becomes its sampling params -----------------------------------------


def request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})


def test_required_and_named_tool_choices_constrain_the_output_with_the_tools_schemas() -> None:
    required = ToolUse.of(request(tools=WEATHER_TOOLS, tool_choice="required", parallel_tool_calls=False), None)
    assert required.parser is RequiredToolCallsParser
    params = required.sampling_params(SamplingParams(), None)
    assert params.structured_outputs.spec == required_schema(WEATHER_TOOLS, parallel=False)
    named = ToolUse.of(request(tools=WEATHER_TOOLS, tool_choice=NAMED), None)
    assert named.parser is NamedToolCallParser and named.parser_tools == WEATHER_TOOLS[:1]
    assert (
        named.sampling_params(SamplingParams(), None).structured_outputs.spec
        == WEATHER_TOOLS[0]["function"]["parameters"]
    )
    constrained = SamplingParams(structured_outputs=StructuredOutputsParams(regex="a+"))
    with pytest.raises(OpenAIError, match="cannot be combined with another constraint") as raised:
        named.sampling_params(constrained, None)
    assert raised.value.param == "tool_choice"


def test_auto_tool_choice_takes_the_parsers_sampling_params() -> None:
    auto = ToolUse.of(request(tools=WEATHER_TOOLS), MistralToolParser)
    assert auto.mode == "auto" and not auto.sampling_params(SamplingParams(), None).skip_special_tokens
    none = ToolUse.of(request(tools=WEATHER_TOOLS, tool_choice="none"), MistralToolParser)
    assert none.new_parser(None) is None and none.sampling_params(SamplingParams(), None) == SamplingParams()
    assert none.tools == WEATHER_TOOLS, "tool_choice none still shows the tools to the template"


def test_finish_reason_says_tool_calls_for_calls_that_stopped_unless_named() -> None:
    auto = ToolUse.of(request(tools=WEATHER_TOOLS), MistralToolParser)
    assert [auto.finish_reason(r, True) for r in ("stop", "length")] == ["tool_calls", "length"]
    assert auto.finish_reason("stop", False) == "stop"
    assert ToolUse.of(request(tools=WEATHER_TOOLS, tool_choice=NAMED), None).finish_reason("stop", True) == "stop"


# -- kvserve serve's options -------------------------------------------------------------------------


def test_serve_options_set_the_tool_calling_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from kvserve.cli import serve  # noqa: F401  (registers the command)
    from kvserve.cli.app import app

    served = []
    monkeypatch.setattr("kvserve.server.runner.serve", lambda config, log_level: served.append(config))
    options = ["--chat-template", "t.jinja", "--tool-parser-plugin", "p.py", "--tool-call-parser", "hermes"]
    result = CliRunner().invoke(app, ["serve", "--enable-auto-tool-choice", *options])
    assert result.exit_code == 0, result.output
    server = served[0].server
    assert (server.enable_auto_tool_choice, server.tool_call_parser) == (True, "hermes")
    assert (server.chat_template, server.tool_parser_plugin) == ("t.jinja", "p.py")
    refused = CliRunner().invoke(app, ["serve", "--enable-auto-tool-choice"])
    assert refused.exit_code != 0 and "enable_auto_tool_choice needs tool_call_parser" in str(refused.exception), (
        refused.output
    )


def test_a_hermes_server_gives_a_reply_without_calls_as_its_text(make_server, tiny_llm) -> None:
    """The real parser on the server's path: the tiny model's text has no <tool_call>, so it is all content,
    whole or streamed, and the same as with tool_choice none."""
    with make_server(tiny_llm, enable_auto_tool_choice=True, tool_call_parser="hermes") as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        args = dict(model=MODEL, messages=CONVERSATION, tools=WEATHER_TOOLS, max_tokens=12, seed=3, temperature=1.0)
        args["extra_body"] = {"ignore_eos": True}
        text = client.chat.completions.create(**args, tool_choice="none").choices[0].message.content
        whole = client.chat.completions.create(**args).choices[0]
        chunks = list(client.chat.completions.create(**args, stream=True))
    assert text and (whole.message.content, whole.message.tool_calls, whole.finish_reason) == (text, None, "length")
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert not any(c.choices[0].delta.tool_calls for c in chunks)


def test_a_tokenizer_with_named_templates_uses_its_tool_use_one_for_tools(make_server, tiny_llm) -> None:
    tokenizer = tiny_llm.tokenizer
    default = tokenizer.chat_template
    tokenizer.chat_template = {"default": default, "tool_use": TEMPLATE_WITH_TOOLS}
    try:
        with make_server(tiny_llm) as server:
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
            with_tools = prompt_tokens(client, messages=CONVERSATION[:1], tools=WEATHER_TOOLS, tool_choice="none")
            without = prompt_tokens(client, messages=CONVERSATION[:1])
    finally:
        tokenizer.chat_template = default
    text = tokenizer.apply_chat_template(
        CONVERSATION[:1],
        tools=WEATHER_TOOLS,
        chat_template=TEMPLATE_WITH_TOOLS,
        add_generation_prompt=True,
        tokenize=False,
    )
    assert with_tools == len(tokenizer.encode(text, add_special_tokens=False))
    plain = tokenizer.apply_chat_template(CONVERSATION[:1], add_generation_prompt=True, tokenize=False)
    assert without == len(tokenizer.encode(plain, add_special_tokens=False))
