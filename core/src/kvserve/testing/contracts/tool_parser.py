"""The ToolParser contract: canned replies parse as stated, a stream cut anywhere says what the whole
reply says, and text without calls comes back unchanged."""

from __future__ import annotations

import codecs
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest

from kvserve.interfaces.tool_parser import ExtractedToolCalls, ToolParser, ToolParserDelta
from kvserve.sampling_params import SamplingParams
from kvserve.testing.contracts._base import ComponentContract, violation


@dataclass(frozen=True)
class ToolParserCase:
    """A reply in the parser's format and what it holds: its ``content`` and its ``tool_calls`` as
    ``(name, arguments)`` pairs, the arguments as the JSON value they must parse to."""

    output: str
    content: str = ""
    tool_calls: list[tuple[str, Any]] = field(default_factory=list)

    def __str__(self) -> str:  # the test id
        return self.output if len(self.output) <= 40 else self.output[:37] + "..."


WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]

PLAIN_REPLIES = [
    "",
    "Hello! How can I help you today?",
    "The answer is 42.\n\nAnything else?",
    "Trailing whitespace stays  \n",
    "  \n leading whitespace too",
    "Use <b>bold</b>, [links](https://example.com) and `code()`.",
    "A list: 1) one, 2) two; a map: {a: 1}.",
    "狐狸 🦊 e\u0301 \u200b — unicode ✓",
]
"""Replies without a call in any format: every parser gives them back as content, unchanged."""


def _utf8_pieces(text: str, cuts: Iterable[int]) -> list[str]:
    """``text`` as a detokenizer may send it: its UTF-8 bytes cut at ``cuts`` (byte offsets, maybe inside
    a character), each piece decoded incrementally (a cut character arrives whole with its last byte)."""
    data, decoder = text.encode(), codecs.getincrementaldecoder("utf-8")()
    bounds = [0, *sorted(cuts), len(data)]
    return [decoder.decode(data[a:b], final=b == len(data)) for a, b in zip(bounds, bounds[1:])]


def joined(deltas: list[ToolParserDelta], where: str) -> tuple[str, list[tuple[str, str]]]:
    """A stream's deltas joined as ``(content, [(name, arguments)])``, checking they are shaped as OpenAI's."""
    content: list[str] = []
    calls: list[list[str]] = []
    for delta in deltas:
        if not isinstance(delta, ToolParserDelta):
            violation(f"{where}: a streaming call returned {delta!r}, not a ToolParserDelta")
        content.append(delta.content)
        for call in delta.tool_calls:
            if call.name is not None:
                if call.index != len(calls) or not call.name:
                    violation(f"{where}: tool-call delta {call!r} names call {call.index}, but {len(calls)} began")
                calls.append([call.name, ""])
            elif call.index != len(calls) - 1:
                violation(f"{where}: tool-call delta {call!r} continues a call that is not the last one begun")
            calls[call.index][1] += call.arguments
    return "".join(content), [(name, arguments) for name, arguments in calls]


class ToolParserContract(ComponentContract):
    """Every tool parser plugin must pass this. Subclass it, name the parser and give replies in its format::

        class TestMyParser(ToolParserContract):
            tool_parser = "my_format"

            def cases(self):
                return [ToolParserCase('<call>{"name": "get_weather", "arguments": {"city": "Paris"}}</call>',
                                       tool_calls=[("get_weather", {"city": "Paris"})])]

    The parser is built as the server builds it, ``cls(tokenizer, tools)``, over :meth:`tokenizer` and
    :attr:`tools`. Each case's reply must parse to what the case states, whole and streamed; streamed
    cut at every byte (a cut inside a character delivers it whole later, an empty delta in between,
    as a detokenizer does), one character at a time, and at random, every stream must give what the
    whole reply gives, with deltas shaped as OpenAI's (a call's first delta names it, indices count up
    from 0, a call is done once the next begins). So must every prefix of the cases (a reply cut short
    by ``max_tokens``), random splices of them, and :data:`PLAIN_REPLIES`, which must come back as
    content unchanged.
    """

    kind = "tool_parser"
    interface = ToolParser
    tool_parser: ClassVar[str]
    """Registry name of the parser under test."""
    tools: ClassVar[list[dict[str, Any]]] = WEATHER_TOOLS
    """The request's tools the parser is built with (the cases' calls use them)."""

    # -- hooks -----------------------------------------------------------------------------
    def cases(self) -> list[ToolParserCase]:
        """Replies in the parser's format, with what they hold; at least one with tool calls."""
        return []

    def tokenizer(self) -> Any:
        """The tokenizer the parser is built with; None unless the parser needs one."""
        return None

    # -- helpers ---------------------------------------------------------------------------
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        super().pytest_generate_tests(metafunc)
        if "case" in metafunc.fixturenames:
            cases = self.cases()
            metafunc.parametrize("case", cases, ids=[str(c) for c in cases] if cases else None)

    def build(self, component: type) -> ToolParser:
        return component(self.tokenizer(), self.tools)

    def whole(self, component: type, text: str) -> tuple[str, list[tuple[str, str]]]:
        """``text`` parsed as a whole reply, as ``(content, [(name, arguments)])``."""
        result = self.build(component).extract_tool_calls(text)
        if not isinstance(result, ExtractedToolCalls):
            violation(f"extract_tool_calls returned {result!r}, not an ExtractedToolCalls")
        return result.content, [(call.name, call.arguments) for call in result.tool_calls]

    def streamed(self, component: type, pieces: list[str]) -> tuple[str, list[tuple[str, str]]]:
        """``pieces`` streamed through a fresh parser, joined as ``(content, [(name, arguments)])``."""
        parser = self.build(component)
        deltas = [parser.extract_tool_calls_streaming(piece) for piece in pieces]
        return joined([*deltas, parser.finish_streaming()], f"streaming {pieces!r}")

    def check_stream(self, component: type, text: str, pieces: list[str], how: str) -> None:
        """The stream of ``pieces`` (joined: ``text``) gives what the whole of ``text`` gives."""
        whole, stream = self.whole(component, text), self.streamed(component, pieces)
        if stream != whole:
            violation(
                f"streaming {text!r} {how} gives content {stream[0]!r} and calls {stream[1]!r}, but the whole "
                f"reply gives content {whole[0]!r} and calls {whole[1]!r} (deltas: {pieces!r})"
            )

    def check_every_cut(self, component: type, text: str) -> None:
        """Streams of ``text`` cut at every byte, then one character at a time."""
        for cut in range(len(text.encode()) + 1):
            self.check_stream(component, text, _utf8_pieces(text, [cut, cut]), f"cut after byte {cut}")
        self.check_stream(component, text, list(text), "one character at a time")

    # -- the contract ------------------------------------------------------------------------
    def test_cases_are_given(self) -> None:
        """The contract subclass gives replies in the parser's format, some with calls."""
        if not any(case.tool_calls for case in self.cases()):
            violation(
                f"{type(self).__name__}.cases() gives no reply with calls: a parser's contract needs replies in its "
                "format (ship a ToolParserContract subclass with cases() and name it with the 'contract' fact)"
            )

    def test_whole_reply_holds_what_the_case_states(self, component, case: ToolParserCase) -> None:
        content, calls = self.whole(component, case.output)
        assert content == case.content, f"content of {case.output!r} is {content!r}, not {case.content!r}"
        names = [name for name, _ in calls]
        assert names == [name for name, _ in case.tool_calls], f"calls of {case.output!r}: {calls!r}"
        for (name, arguments), (_, expected) in zip(calls, case.tool_calls):
            try:
                value = json.loads(arguments)
            except ValueError:
                violation(f"the arguments of call {name!r} in {case.output!r} are not JSON: {arguments!r}")
            assert value == expected, f"the arguments of call {name!r} in {case.output!r} are {value!r}"

    def test_stream_cut_anywhere_gives_the_whole_reply(self, component, case: ToolParserCase) -> None:
        self.check_every_cut(component, case.output)

    def test_replies_cut_short_stream_as_they_parse(self, component, case: ToolParserCase) -> None:
        """Each prefix of the reply (``max_tokens`` may end it anywhere), one character at a time."""
        for end in range(len(case.output)):
            prefix = case.output[:end]
            self.check_stream(component, prefix, list(prefix), "one character at a time")

    @pytest.mark.parametrize("text", PLAIN_REPLIES)
    def test_text_without_calls_is_content_unchanged(self, component, text: str) -> None:
        content, calls = self.whole(component, text)
        assert (content, calls) == (text, []), f"{text!r} parsed as content {content!r} and calls {calls!r}"
        self.check_every_cut(component, text)

    def test_random_splices_stream_as_they_parse(self, component, seed: int) -> None:
        """Replies spliced from pieces of the cases and plain text (delimiters cut and misplaced, calls
        broken), each streamed at random cuts: never an error, and the stream gives the whole reply."""
        rng = random.Random(seed)
        sources = [case.output for case in self.cases()] + PLAIN_REPLIES
        for _ in range(20):
            parts = []
            for _ in range(rng.randint(1, 4)):
                source = rng.choice(sources)
                start = rng.randint(0, len(source))
                parts.append(source[start : rng.randint(start, len(source))])
            text = "".join(parts)
            size = len(text.encode())
            cuts = [rng.randint(0, size) for _ in range(rng.randint(1, 6))]
            self.check_stream(component, text, _utf8_pieces(text, cuts), f"cut at bytes {sorted(cuts)}")
            self.check_stream(component, text, list(text), "one character at a time")

    def test_parsers_keep_their_own_state(self, component) -> None:
        """Two replies streamed through two parsers at once, delta for delta, each give their own result."""
        texts = [self.cases()[0].output, PLAIN_REPLIES[2]]
        parsers = [self.build(component), self.build(component)]
        deltas: list[list[ToolParserDelta]] = [[], []]
        for i in range(max(map(len, texts)) + 1):
            for parser, text, sent in zip(parsers, texts, deltas):
                sent.append(parser.extract_tool_calls_streaming(text[i : i + 1]))
        for parser, text, sent in zip(parsers, texts, deltas):
            result = joined([*sent, parser.finish_streaming()], f"streaming {text!r} beside another reply")
            whole = self.whole(component, text)
            assert result == whole, f"{text!r} streamed beside another reply gives {result!r}, not {whole!r}"

    def test_call_ids_are_fresh(self, component) -> None:
        parser = self.build(component)
        ids = [parser.make_tool_call_id() for _ in range(50)]
        assert all(isinstance(i, str) and i for i in ids) and len(set(ids)) == 50, f"call ids: {ids[:5]}..."

    def test_adjusted_sampling_params_are_sampling_params(self, component) -> None:
        params = self.build(component).adjust_sampling_params(SamplingParams(max_tokens=7))
        assert isinstance(params, SamplingParams) and params.max_tokens == 7, params


# -- the canned replies of core's parsers --------------------------------------------------------

PARIS = ("get_weather", {"city": "Paris", "unit": "celsius"})
NOW = ("get_time", {})


class HermesContract(ToolParserContract):
    """``hermes``: Qwen 2.5 / 3 and Hermes replies."""

    def cases(self) -> list[ToolParserCase]:
        call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
        return [
            ToolParserCase(call, "", [PARIS]),
            ToolParserCase(f"Let me check.\n\n{call}", "Let me check.", [PARIS]),
            ToolParserCase(
                f'{call}\n<tool_call>\n{{"name": "get_time", "arguments": {{}}}}\n</tool_call>', "", [PARIS, NOW]
            ),
            ToolParserCase(
                '<tool_call>{"arguments": {"city": "Zürich \\"</tool_call>\\" 🦊"}, "name": "get_weather"}</tool_call>',
                "",
                [("get_weather", {"city": 'Zürich "</tool_call>" 🦊'})],
            ),
            ToolParserCase('Before <tool_call>{"name": "get_time"}</tool_call> and after', "Before and after", [NOW]),
            ToolParserCase("<tool_call>not a call</tool_call>", "<tool_call>not a call</tool_call>"),
            ToolParserCase("I use <tool_call> tags.", "I use <tool_call> tags."),
        ]


class Llama3JsonContract(ToolParserContract):
    """``llama3_json``: Llama 3.1 / 3.2 JSON replies."""

    def cases(self) -> list[ToolParserCase]:
        weather = '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}'
        return [
            ToolParserCase(weather, "", [PARIS]),
            ToolParserCase(f"<|python_tag|>{weather}", "", [PARIS]),
            ToolParserCase(f'{weather}; {{"name": "get_time", "arguments": {{}}}}', "", [PARIS, NOW]),
            ToolParserCase('{"city": "Paris"} is JSON, not a call', '{"city": "Paris"} is JSON, not a call'),
            ToolParserCase(f"Calls come first: {weather}", f"Calls come first: {weather}"),
        ]


class MistralContract(ToolParserContract):
    """``mistral``: Mistral 7B v0.3 / Nemo replies."""

    def cases(self) -> list[ToolParserCase]:
        calls = '[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, {"name": "get_time"}]'
        return [
            ToolParserCase(f"[TOOL_CALLS] {calls}", "", [PARIS, NOW]),
            ToolParserCase(f"One moment. [TOOL_CALLS]{calls}", "One moment.", [PARIS, NOW]),
            ToolParserCase("[TOOL_CALLS] [1, 2]", "[TOOL_CALLS] [1, 2]"),
            ToolParserCase("A [list] is not a call.", "A [list] is not a call."),
        ]


class PythonicContract(ToolParserContract):
    """``pythonic``: Llama 3.2 / 4 replies."""

    def cases(self) -> list[ToolParserCase]:
        return [
            ToolParserCase("[get_weather(city='Paris', unit=\"celsius\")]", "", [PARIS]),
            ToolParserCase("[get_weather(city='Paris', unit='celsius'), get_time()]", "", [PARIS, NOW]),
            ToolParserCase(
                "[get_weather(city='Rue (1), Paris', days=[1, 2], hourly=True, extra={'a': None})]",
                "",
                [("get_weather", {"city": "Rue (1), Paris", "days": [1, 2], "hourly": True, "extra": {"a": None}})],
            ),
            ToolParserCase("[1, 2, 3] are numbers", "[1, 2, 3] are numbers"),
            ToolParserCase("Call get_time() later.", "Call get_time() later."),
        ]
