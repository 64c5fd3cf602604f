"""The replies of ``tool_choice="required"`` and of a named function, which a grammar built from the tools'
parameter schemas (:mod:`kvserve.tool_calling.schema`) holds to a fixed form. Not registered: the
server picks them for those choices, whatever ``--tool-call-parser`` says."""

from __future__ import annotations

from typing import Any

from kvserve.interfaces.tool_parser import ToolCallDelta, ToolParser, ToolParserDelta
from kvserve.tool_calling.base import JsonCallListParser


class RequiredToolCallsParser(JsonCallListParser):
    """``tool_choice="required"``: the reply is a JSON list of ``{"name", "parameters"}`` objects."""

    name = "required"
    argument_keys = ("parameters",)


class NamedToolCallParser(ToolParser):
    """``tool_choice`` names a function (``tools`` holds that one tool): the whole reply is its arguments."""

    name = "named"

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]]) -> None:
        super().__init__(tokenizer, tools)
        self._function = tools[0]["function"]["name"]
        self._named = False

    def extract_tool_calls_streaming(self, delta_text: str) -> ToolParserDelta:
        if self._named and not delta_text:
            return ToolParserDelta()
        name = None if self._named else self._function
        self._named = True
        return ToolParserDelta(tool_calls=[ToolCallDelta(0, name, delta_text)])

    def finish_streaming(self) -> ToolParserDelta:
        return self.extract_tool_calls_streaming("")
