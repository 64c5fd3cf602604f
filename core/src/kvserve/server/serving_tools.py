"""Tool calling in ``/v1/chat/completions``, as vLLM does it.

``tool_choice``, with ``tools`` given:

- ``"none"``: the tools reach the chat template, the reply is text;
- ``"auto"`` (the default with tools): the model decides; the parser chosen by ``--tool-call-parser``
  (with ``--enable-auto-tool-choice``; without them a 400) reads the calls it wrote;
- ``"required"``: one or more calls, held by a grammar to a JSON list of ``{"name", "parameters"}``
  objects built from the tools' parameter schemas (``maxItems`` 1 without ``parallel_tool_calls``);
- ``{"type": "function", "function": {"name": ...}}``: that function, the reply held to its parameters'
  schema and taken whole as its arguments.

A reply with calls ends with ``finish_reason="tool_calls"`` where it would have said ``"stop"`` (a
named function keeps ``"stop"``, as OpenAI does). ``parallel_tool_calls=false`` keeps the first call
of an ``auto`` reply.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from kvserve.config import ServerConfig
from kvserve.interfaces.tool_parser import ToolParser, ToolParserDelta
from kvserve.plugins import load_component
from kvserve.sampling_params import SamplingParams
from kvserve.server.errors import OpenAIError
from kvserve.server.protocol import ChatCompletionRequest
from kvserve.server.protocol_tools import DeltaFunctionCall, DeltaToolCall, FunctionCall, ToolCall
from kvserve.structured_outputs import StructuredOutputsParams
from kvserve.tool_calling.forced import NamedToolCallParser, RequiredToolCallsParser
from kvserve.tool_calling.plugin_file import load_tool_parser_file
from kvserve.tool_calling.schema import parameters_schema, required_schema

logger = logging.getLogger("kvserve")

AUTO_NEEDS_PARSER = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'


def auto_tool_parser(config: ServerConfig) -> type[ToolParser] | None:
    """The parser of ``tool_choice="auto"`` the server's config chooses (None: auto is refused), after
    registering those of ``tool_parser_plugin``."""
    if config.tool_parser_plugin is not None:
        names = load_tool_parser_file(config.tool_parser_plugin)
        logger.info("tool parsers %s registered from %s", ", ".join(names), config.tool_parser_plugin)
    if not config.enable_auto_tool_choice:
        return None
    return load_component("tool_parser", config.tool_call_parser)  # type: ignore[arg-type]  # set: the config checks


@dataclass
class ToolUse:
    """How one chat request uses tools."""

    mode: Literal["none", "auto", "required", "named"]
    tools: list[dict[str, Any]]
    """The request's tools as the chat template and the parsers take them (OpenAI's shape)."""
    parser: type[ToolParser] | None
    """What reads the reply's calls (None: text only)."""
    parser_tools: list[dict[str, Any]]
    parallel: bool

    @classmethod
    def of(cls, body: ChatCompletionRequest, auto_parser: type[ToolParser] | None) -> ToolUse:
        """The request's tool use; a ``tool_choice`` the server cannot honour is a 400 naming it."""
        tools = [tool.model_dump(exclude_none=True) for tool in body.tools or []]
        choice = body.tool_choice if body.tool_choice is not None else ("auto" if tools else "none")
        parallel = body.parallel_tool_calls is not False
        if choice == "none":
            return cls("none", tools, None, [], parallel)
        if not tools:
            raise OpenAIError(400, "tool_choice: only allowed with tools", param="tool_choice")
        if choice == "auto":
            if auto_parser is None:
                raise OpenAIError(400, f"tool_choice: {AUTO_NEEDS_PARSER}", param="tool_choice")
            return cls("auto", tools, auto_parser, tools, parallel)
        if choice == "required":
            return cls("required", tools, RequiredToolCallsParser, tools, parallel)
        named = [tool for tool in tools if tool["function"]["name"] == choice.function.name]  # type: ignore[union-attr]
        if not named:
            available = ", ".join(repr(tool["function"]["name"]) for tool in tools)
            message = f"tool_choice: no function named {choice.function.name!r} in tools (they have {available})"  # type: ignore[union-attr]
            raise OpenAIError(400, message, param="tool_choice")
        return cls("named", tools, NamedToolCallParser, named[:1], parallel)

    def sampling_params(self, params: SamplingParams, tokenizer: Any) -> SamplingParams:
        """``params`` as the tool choice needs them: a grammar for ``required`` and a named function,
        the parser's adjustments (special tokens kept) for ``auto``."""
        if self.mode == "auto":
            return self.new_parser(tokenizer).adjust_sampling_params(params)  # type: ignore[union-attr]
        if self.mode == "none":
            return params
        if params.structured_outputs is not None:
            raise OpenAIError(
                400,
                f"tool_choice: {self.mode} tool choice constrains the output, so it cannot be combined with "
                "another constraint (response_format, structured_outputs)",
                param="tool_choice",
            )
        try:
            schema = required_schema(self.tools, self.parallel) if self.mode == "required" else None
        except ValueError as exc:
            raise OpenAIError(400, str(exc), param="tools") from None
        schema = schema or parameters_schema(self.parser_tools[0])
        # A forced call's arguments are the parameters the tool names, nothing more (as OpenAI's strict
        # function calling): a schema's open objects would let a small model ramble on in made-up keys.
        forced = StructuredOutputsParams(json=schema, disable_additional_properties=True)
        return params.model_copy(update={"structured_outputs": forced})

    def new_parser(self, tokenizer: Any) -> ToolParser | None:
        return None if self.parser is None else self.parser(tokenizer, self.parser_tools)

    def finish_reason(self, reason: str | None, called: bool) -> str | None:
        """``"tool_calls"`` for a reply that called tools and stopped by itself (not for a named function)."""
        return "tool_calls" if called and reason == "stop" and self.mode != "named" else reason


@dataclass
class ToolReply:
    """One choice's reply read for tool calls: whole, or one delta at a time."""

    use: ToolUse
    parser: ToolParser
    called: bool = False

    def whole(self, text: str) -> tuple[str | None, list[ToolCall] | None]:
        """The reply's content (None when it only calls) and calls (None when it has none)."""
        extracted = self.parser.extract_tool_calls(text)
        calls = extracted.tool_calls if self.use.parallel else extracted.tool_calls[:1]
        if not calls:
            return extracted.content, None
        self.called = True
        return extracted.content or None, [
            ToolCall(id=self.parser.make_tool_call_id(), function=FunctionCall(name=c.name, arguments=c.arguments))
            for c in calls
        ]

    def delta(self, text: str, finished: bool) -> tuple[str | None, list[DeltaToolCall] | None]:
        """What the next ``text`` of the reply (the last if ``finished``) adds: content, call deltas."""
        deltas = [self.parser.extract_tool_calls_streaming(text)]
        if finished:
            deltas.append(self.parser.finish_streaming())
        return "".join(d.content for d in deltas) or None, self._calls(deltas) or None

    def _calls(self, deltas: list[ToolParserDelta]) -> list[DeltaToolCall]:
        calls = []
        for delta in deltas:
            for call in delta.tool_calls:
                if call.index > 0 and not self.use.parallel:
                    continue
                if call.name is None:
                    calls.append(DeltaToolCall(index=call.index, function=DeltaFunctionCall(arguments=call.arguments)))
                else:
                    self.called = True
                    function = DeltaFunctionCall(name=call.name, arguments=call.arguments)
                    call_id = self.parser.make_tool_call_id()
                    calls.append(DeltaToolCall(index=call.index, id=call_id, type="function", function=function))
        return calls
