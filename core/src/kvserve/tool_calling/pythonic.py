"""``pythonic``: a Python list of calls, ``[get_weather(city="Paris"), get_time(zone="CET")]``, as Llama 3.2
and Llama 4 (and ToolACE) write them, the values read with Python's ``ast``."""

from __future__ import annotations

import ast
import json
import re

from kvserve.interfaces.tool_parser import ToolCallDelta
from kvserve.tool_calling.base import StreamingToolParser

_KEYWORD = re.compile(r"\s*([A-Za-z_]\w*)\s*=(?!=)(.*)", re.DOTALL)
_JSON_WORDS = {"true": True, "false": False, "null": None}


def argument_json(source: str) -> str:
    """A keyword argument's value as JSON: the Python literal's value (``true``/``false``/``null`` as in
    JSON too); an expression that is not a literal is passed on as its source text, a JSON string."""
    source = source.strip()
    try:
        value = _JSON_WORDS[source] if source in _JSON_WORDS else ast.literal_eval(source)
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return json.dumps(source, ensure_ascii=False)


class PythonicToolParser(StreamingToolParser):
    """The reply is a list of calls with keyword arguments, ``[f(a=1), g(b="x")]`` (leading whitespace
    aside). A reply that does not start so is all content, and so is the text after the list.

    A call is sent once its ``name(`` is read; its arguments, a JSON object, one keyword argument at a
    time (positional ones are ignored, as in vLLM); ``f()`` has ``{}``.
    """

    name = "pythonic"

    def __init__(self, tokenizer, tools) -> None:
        super().__init__(tokenizer, tools)
        self._state = "start"  # "start", "name", "paren", "args", "after_call" or "content"
        self._raw = ""  # text read since the last call was sent: content if no call follows
        self._name = ""
        self._argument = ""  # source of the argument being read
        self._sent_arguments = 0  # keyword arguments sent for the open call
        self._quote = ""  # the quote of the Python string being read, if any
        self._escape = False
        self._depth = 0

    def _advance(self, final: bool) -> None:
        while self._state != "content":
            if self._state != "args" and not (self._state == "name" and self._name):
                text = self._buffer.lstrip()  # whitespace between the list's tokens
                self._raw += self._buffer[: len(self._buffer) - len(text)]
                self._buffer = text
            if not self._buffer:
                if not final:
                    return
                if self._state != "args":  # before a call, or between two: content
                    self._emit_content(self._raw)
                self._state = "content"
            elif self._read(self._buffer[0]):
                if self._state not in ("args", "after_call", "content"):
                    self._raw += self._buffer[0]
                self._buffer = self._buffer[1:]
            else:  # not (or no more) a list of calls: what was read since the last call, and the rest, is content
                self._emit_content(self._raw)
                self._state = "content"
        self._take_content(None, final)

    def _read(self, char: str) -> bool:
        """Read one character (not whitespace between tokens); False if it cannot come next."""
        state = self._state
        if state == "args":
            self._argument_char(char)
        elif state == "start":
            self._state = "name"
            return char == "["
        elif state == "name" and (char.isidentifier() or (self._name and char.isdigit())):
            self._name += char
        elif state in ("name", "paren") and self._name and char == "(":
            self._deltas.append(ToolCallDelta(self._calls, self._name))
            self._calls += 1
            self._state, self._raw, self._sent_arguments = "args", "", 0
        elif state == "name" and self._name and char.isspace():
            self._state = "paren"
        elif state == "after_call" and char in ",]":
            self._state, self._name, self._raw = ("name" if char == "," else "content"), "", ""
        else:
            return False
        return True

    def _argument_char(self, char: str) -> None:
        if self._quote:
            if self._escape:
                self._escape = False
            elif char == "\\":
                self._escape = True
            elif char == self._quote:
                self._quote = ""
        elif char in "'\"":
            self._quote = char
        elif char in "([{":
            self._depth += 1
        elif char in ")]}" and self._depth:
            self._depth -= 1
        elif char in ",)" and not self._depth:
            self._send_argument()
            if char == ")":
                self._send("}" if self._sent_arguments else "{}")
                self._state, self._after_call = "after_call", True
            return
        self._argument += char

    def _send_argument(self) -> None:
        match = _KEYWORD.fullmatch(self._argument)
        self._argument = ""
        if match is not None:  # else a positional argument, or none
            key, value = json.dumps(match.group(1), ensure_ascii=False), argument_json(match.group(2))
            self._send(f"{', ' if self._sent_arguments else '{'}{key}: {value}")
            self._sent_arguments += 1

    def _send(self, arguments: str) -> None:
        self._deltas.append(ToolCallDelta(self._calls - 1, arguments=arguments))
