"""Deliberately broken copies of core's ``hermes`` tool parser: each breaks one rule of the contract.

Test fixtures for ``core/tests/test_tool_parser_contract_mutants.py``, which asserts that the tool
parser contract fails each of them with a message naming the broken behaviour.
"""

from __future__ import annotations

from kvserve.interfaces.tool_parser import ToolParserDelta
from kvserve.tool_calling.hermes import START, HermesToolParser


class LosesSplitDelimiter(HermesToolParser):
    """Looks for ``<tool_call>`` in the text it holds but never holds back a delimiter's start: a tag
    cut by a delta goes out as content, and so does the call after it."""

    name = "hermes_loses_split_delimiter"

    def _take_content(self, delimiter, final):
        if delimiter == START and START not in self._buffer:
            self._emit_content(self._buffer)
            self._buffer = ""
            return False
        return super()._take_content(delimiter, final)


class ForgetsHeldText(HermesToolParser):
    """Sends nothing once the reply ends: text it held back (trailing whitespace, a tag's start) is lost,
    in a whole reply too."""

    name = "hermes_forgets_held_text"

    def finish_streaming(self):
        return ToolParserDelta()
