"""An incremental scanner of one JSON tool-call object, ``{"name": "f", "arguments": {...}}``.

It reads the object a piece at a time, as a stream brings it, and knows at each point what is
settled: the call's name once its string has closed, and the raw text of its arguments as far as
it has come. The arguments are passed on as the model wrote them (every prefix of them is final),
so a stream can send them while they are written.
"""

from __future__ import annotations

import json

_WHITESPACE = " \t\n\r"
_LITERAL = frozenset("-+.0123456789eEtrufalsn")
"""Characters of JSON numbers, ``true``, ``false`` and ``null``."""


class CallObjectScanner:
    """One JSON object scanned as its characters arrive.

    ``name`` is the value of its ``"name"`` key, once that string has closed; ``arguments`` the raw
    text of the value of the first of ``argument_keys`` it holds, growing as it is scanned
    (``has_arguments`` once that value has begun). Other keys are skipped. ``done`` once the closing
    brace is read; ``failed`` on a character that cannot continue a JSON object, or a name that is not
    a non-empty string (the scanner then stops before that character).
    """

    def __init__(self, argument_keys: tuple[str, ...]) -> None:
        self.argument_keys = argument_keys
        self.name: str | None = None
        self.arguments = ""
        self.has_arguments = False
        self.done = False
        self.failed = False
        self._state = "start"
        self._key = ""
        self._target: str | None = None  # "name", "arguments" or None: what the value being read is
        self._value = ""  # raw text of a name value
        self._kind = ""  # "string", "container" or "literal"
        self._depth = 0
        self._in_string = False
        self._escape = False

    def feed(self, text: str) -> int:
        """Scan ``text`` until the object ends or fails; returns how many characters it consumed."""
        for position, char in enumerate(text):
            if not self._step(char):
                self.failed = True
                return position
            if self.done:
                return position + 1
        return len(text)

    def _step(self, char: str) -> bool:
        """Read one character; False if it cannot come next."""
        state = self._state
        if state == "value":
            return self._value_char(char)
        if state == "key":
            return self._key_char(char)
        if char in _WHITESPACE:
            return True
        if state == "start":
            self._state = "first_key"
            return char == "{"
        if state in ("first_key", "key_start"):
            if char == '"':
                self._state, self._key = "key", ""
                return True
            self.done = state == "first_key" and char == "}"
            return self.done
        if state == "colon":
            self._state = "value_start"
            return char == ":"
        if state == "value_start":
            return self._begin_value(char)
        # after_value
        if char == ",":
            self._state = "key_start"
            return True
        self.done = char == "}"
        return self.done

    def _key_char(self, char: str) -> bool:
        if self._escape:
            self._escape = False
        elif char == "\\":
            self._escape = True
        elif char == '"':
            self._state = "colon"
            return True
        self._key += char
        return True

    def _begin_value(self, char: str) -> bool:
        try:
            key = json.loads(f'"{self._key}"')
        except ValueError:
            return False
        if key == "name" and self.name is None:
            self._target = "name"
        elif key in self.argument_keys and not self.has_arguments:
            self._target, self.has_arguments = "arguments", True
        else:
            self._target = None
        if char == '"':
            self._kind, self._in_string = "string", True
        elif char in "{[":
            self._kind, self._depth = "container", 1
        elif char in _LITERAL:
            self._kind = "literal"
        else:
            return False
        self._state, self._value = "value", ""
        self._take(char)
        return True

    def _value_char(self, char: str) -> bool:
        if self._kind == "literal" and char not in _LITERAL:
            return self._end_value() and self._step(char)  # the character after a literal ends it
        self._take(char)
        if self._in_string:
            if self._escape:
                self._escape = False
            elif char == "\\":
                self._escape = True
            elif char == '"':
                self._in_string = False
                if self._kind == "string":
                    return self._end_value()
        elif self._kind == "container":
            if char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return self._end_value()
        return True

    def _take(self, char: str) -> None:
        if self._target == "arguments":
            self.arguments += char
        elif self._target == "name":
            self._value += char

    def _end_value(self) -> bool:
        self._state = "after_value"
        if self._target != "name":
            return True
        try:
            name = json.loads(self._value)
        except ValueError:
            return False
        if not isinstance(name, str) or not name:
            return False
        self.name = name
        return True
