"""Tool calling's pieces without a server: the schemas that force calls, the parsers of forced replies, the
conversation a chat template gets, parser files, and ``--chat-template``."""

from __future__ import annotations

import json
import textwrap

import jsonschema
import pytest
from transformers import AutoTokenizer

from kvserve.chat_template import ChatTemplateError, load_chat_template, render_chat
from kvserve.errors import ConfigError
from kvserve.plugins import load_component
from kvserve.testing.contracts.tool_parser import WEATHER_TOOLS, ToolParserCase, ToolParserContract
from kvserve.tool_calling.forced import NamedToolCallParser, RequiredToolCallsParser
from kvserve.tool_calling.plugin_file import load_tool_parser_file
from kvserve.tool_calling.pythonic import argument_json
from kvserve.tool_calling.schema import ANY_OBJECT, parameters_schema, required_schema
from kvserve.tool_calling.template import TOOLS_HEADER, conversation_for_template, template_knows_tools

WEATHER, TIME = WEATHER_TOOLS


class TestRequiredToolCallsParser(ToolParserContract):
    """The reply of ``tool_choice="required"`` (not registered: the server picks it)."""

    tool_parser = "required"

    @classmethod
    def load_component(cls):
        return RequiredToolCallsParser

    def cases(self):
        weather = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
        return [
            ToolParserCase(f"[{weather}]", "", [("get_weather", {"city": "Paris"})]),
            ToolParserCase(
                f'[{weather},{{"name":"get_time","parameters":{{}}}}]',
                "",
                [("get_weather", {"city": "Paris"}), ("get_time", {})],
            ),
            ToolParserCase("Not a list", "Not a list"),
        ]


def test_a_named_function_takes_the_whole_reply_as_its_arguments():
    parser = NamedToolCallParser(None, [WEATHER])
    assert parser.extract_tool_calls('{"city": "Oslo"}').tool_calls[0].arguments == '{"city": "Oslo"}'
    first, rest, end = (parser.extract_tool_calls_streaming(t) for t in ('{"city"', ': "Oslo"}', ""))
    assert [(d.index, d.name, d.arguments) for d in first.tool_calls] == [(0, "get_weather", '{"city"')]
    assert [(d.index, d.name, d.arguments) for d in rest.tool_calls] == [(0, None, ': "Oslo"}')]
    assert not end.tool_calls and not parser.finish_streaming().tool_calls
    empty = NamedToolCallParser(None, [WEATHER])
    assert [(d.name, d.arguments) for d in empty.finish_streaming().tool_calls] == [("get_weather", "")]


def test_the_required_schema_accepts_exactly_calls_of_the_tools():
    schema = required_schema(WEATHER_TOOLS, parallel=True)
    jsonschema.Draft202012Validator.check_schema(schema)
    good = [{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {}}]
    jsonschema.validate(good, schema)
    for bad in ([], [{"name": "get_weather", "parameters": {}}], [{"name": "nope", "parameters": {}}], {"a": 1}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    single = required_schema(WEATHER_TOOLS, parallel=False)
    assert single["maxItems"] == 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(good, single)


def test_the_required_schema_moves_definitions_to_its_root():
    point = {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}
    tool = {
        "function": {"name": "move", "parameters": {"$defs": {"P": point}, "properties": {"to": {"$ref": "#/$defs/P"}}}}
    }
    schema = required_schema([tool, WEATHER], parallel=True)
    assert schema["$defs"] == {"P": point} and '"$defs":' not in json.dumps(schema["items"])
    jsonschema.validate([{"name": "move", "parameters": {"to": {"x": 1}}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "move", "parameters": {"to": {"y": 1}}}], schema)
    other = {"function": {"name": "jump", "parameters": {"$defs": {"P": {"type": "string"}}}}}
    with pytest.raises(ValueError, match=r"tools: two functions define '\$defs/P' differently"):
        required_schema([tool, other], parallel=True)


def test_a_named_function_without_parameters_takes_any_object():
    assert parameters_schema(WEATHER) == WEATHER["function"]["parameters"]
    assert parameters_schema({"function": {"name": "ping"}}) == ANY_OBJECT


@pytest.mark.parametrize(
    ("source", "value"),
    [("'x'", "x"), ("[1, (2, 3)]", [1, [2, 3]]), ("true", True), ("None", None), ("float('nan')", "float('nan')"),
     ("{1, 2}", "{1, 2}"), ("some_variable", "some_variable"), ("1e999", "1e999")],
)  # fmt: skip
def test_pythonic_arguments_become_json_or_their_source_text(source, value):
    assert json.loads(argument_json(source)) == value


CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": "18C", "tool_call_id": "call_1"},
]


def test_a_template_that_knows_tools_gets_them_and_the_arguments_as_objects():
    template = "{% for t in tools %}{{ t.function.name }}{% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}"
    assert template_knows_tools(template)
    messages, tools = conversation_for_template(template, json.loads(json.dumps(CONVERSATION)), [WEATHER])
    assert tools == [WEATHER] and messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}


def test_a_template_without_tools_gets_them_in_the_system_message_and_calls_in_the_content():
    template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    assert not template_knows_tools(template)
    messages, tools = conversation_for_template(template, list(CONVERSATION), WEATHER_TOOLS)
    assert tools is None and messages[0]["role"] == "system"
    assert messages[0]["content"].splitlines() == [TOOLS_HEADER, *(json.dumps(t["function"]) for t in WEATHER_TOOLS)]
    assert messages[2] == {"role": "assistant", "content": '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'}
    assert messages[3] == CONVERSATION[2] and "tool_calls" in CONVERSATION[1], "the caller's messages are kept"
    with_system = [{"role": "system", "content": "Be brief."}, *CONVERSATION[:1]]
    merged, _ = conversation_for_template(template, with_system, [TIME])
    assert merged[0]["content"] == f"Be brief.\n\n{TOOLS_HEADER}\n{json.dumps(TIME['function'])}" and len(merged) == 2


def test_a_parser_file_registers_its_parsers_once(tmp_path):
    file = tmp_path / "my_parser.py"
    file.write_text(
        textwrap.dedent("""
        from kvserve.interfaces import ToolParser, ToolParserDelta

        class Nothing(ToolParser):
            name = "from_a_file"

            def extract_tool_calls_streaming(self, delta_text):
                return ToolParserDelta(delta_text)
        """)
    )
    assert load_tool_parser_file(str(file)) == ["from_a_file"]
    assert load_tool_parser_file(str(file)) == ["from_a_file"], "loading it again changes nothing"
    parser = load_component("tool_parser", "from_a_file")(None, [])
    assert parser.extract_tool_calls("hi").content == "hi"
    (tmp_path / "empty.py").write_text("x = 1\n")
    with pytest.raises(ConfigError, match="defines no ToolParser subclass"):
        load_tool_parser_file(str(tmp_path / "empty.py"))
    (tmp_path / "broken.py").write_text("import no_such_module_anywhere\n")
    with pytest.raises(ConfigError, match="importing .* failed: ModuleNotFoundError"):
        load_tool_parser_file(str(tmp_path / "broken.py"))
    with pytest.raises(ConfigError, match="no file"):
        load_tool_parser_file(str(tmp_path / "missing.py"))


def test_chat_template_option_takes_a_file_or_the_template(tmp_path):
    template = "{% for m in messages %}[{{ m.content }}]{% endfor %}"
    (tmp_path / "t.jinja").write_text(template)
    assert load_chat_template(str(tmp_path / "t.jinja")) == template
    assert load_chat_template(template) == template and load_chat_template(None) is None
    with pytest.raises(ConfigError, match="neither a file nor a Jinja template"):
        load_chat_template(str(tmp_path / "missing.jinja"))


def test_render_chat_passes_tools_template_and_kwargs(tiny_tokenizer):
    template = "{% if loud %}!{% endif %}{% for t in tools or [] %}<{{ t.function.name }}>{% endfor %}"
    template += "{{ messages[0].content }}"
    text, _ = render_chat(tiny_tokenizer, [{"role": "user", "content": "hi"}], tools=[TIME], chat_template=template)
    assert text == "<get_time>hi"
    text, _ = render_chat(
        tiny_tokenizer, [{"role": "user", "content": "hi"}], chat_template=template, template_kwargs={"loud": True}
    )
    assert text == "!hi"
    # A template's own failure (None + str) is the conversation's fault, not the server's.
    with pytest.raises(ChatTemplateError, match="the chat template rejected the messages"):
        render_chat(
            tiny_tokenizer, [{"role": "user", "content": None}], chat_template="{{ messages[0].content + 'x' }}"
        )


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    from kvserve.testing.hf_models import build_tiny_model

    return AutoTokenizer.from_pretrained(build_tiny_model("llama", tmp_path_factory.mktemp("tiny")))


def test_definitions_that_are_not_an_object_are_refused():
    tool = {"function": {"name": "odd", "parameters": {"$defs": [1]}}}
    with pytest.raises(ValueError, match=r"tools: the \$defs of function 'odd' must be an object"):
        required_schema([tool], parallel=True)
