"""What core's tool parsers share: the text a stream holds back, content around the calls, and JSON
call objects turned into OpenAI's tool-call deltas.

A parser built on :class:`StreamingToolParser` keeps the text it has not settled in ``_buffer`` and
implements :meth:`~StreamingToolParser._advance`, which settles as much of it as it can. Every
decision depends only on the text so far, never on where the deltas were cut, so a stream and the
whole reply agree (the contract feeds replies cut at every character to check it).

Whitespace is tidied the same way in every format: the whitespace around a call is dropped, so a
reply that is only calls has no content, unless content follows the call: the whitespace that
preceded the call then separates the two pieces of content.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

from kvserve.interfaces.tool_parser import ToolCallDelta, ToolParser, ToolParserDelta
from kvserve.tool_calling.json_scanner import CallObjectScanner


def partial_suffix(text: str, delimiter: str) -> int:
    """Length of the longest end of ``text`` that ``delimiter`` starts with (it may be cut there)."""
    for length in range(min(len(text), len(delimiter) - 1), 0, -1):
        if delimiter.startswith(text[-length:]):
            return length
    return 0


class _OpenCall:
    """A JSON call object being scanned, and how much of it the stream has sent."""

    def __init__(self, argument_keys: tuple[str, ...], opening: str) -> None:
        self.scanner = CallObjectScanner(argument_keys)
        self.raw = opening
        """The text of the call so far, from its opening delimiter: content if it never gets a name."""
        self.index: int | None = None
        self.sent = 0


class StreamingToolParser(ToolParser):
    """Base of core's parsers: a buffer of unsettled text and the helpers to settle it."""

    argument_keys: ClassVar[tuple[str, ...]] = ("arguments",)
    """Keys of a JSON call object whose value is the call's arguments (the first present wins)."""

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]]) -> None:
        super().__init__(tokenizer, tools)
        self._buffer = ""
        self._calls = 0
        self._call: _OpenCall | None = None
        self._after_call = False
        self._spacing = ""  # whitespace between content and the call that followed it
        self._said = False  # whether any content was sent
        self._content: list[str] = []
        self._deltas: list[ToolCallDelta] = []

    def extract_tool_calls_streaming(self, delta_text: str) -> ToolParserDelta:
        self._buffer += delta_text
        self._advance(final=False)
        return self._flush()

    def finish_streaming(self) -> ToolParserDelta:
        self._advance(final=True)
        return self._flush()

    @abstractmethod
    def _advance(self, final: bool) -> None:
        """Settle what ``_buffer`` allows (all of it when ``final``: the reply has ended), through
        :meth:`_emit_content`, :meth:`_take_content` and :meth:`_scan_call`."""

    def _flush(self) -> ToolParserDelta:
        delta = ToolParserDelta("".join(self._content), self._deltas)
        self._content, self._deltas = [], []
        return delta

    # -- content ------------------------------------------------------------------------------
    def _emit_content(self, text: str) -> None:
        """Send ``text`` as content: without the whitespace that directly follows a call, with the
        whitespace that preceded the last call if content comes after it."""
        if self._after_call:
            text = text.lstrip()
        if text:
            self._content.append(self._spacing + text if self._said else text)
            self._spacing, self._after_call, self._said = "", False, True

    def _take_content(self, delimiter: str | None, final: bool) -> bool:
        """Send the buffer as content up to ``delimiter`` (None: up to the end) and consume it; True if
        the delimiter was found (the buffer then starts after it).

        Without the delimiter, the end of the buffer that may still grow into it is held back, and so is
        trailing whitespace, which must not be sent if a call follows; ``final`` sends everything.
        """
        at = self._buffer.find(delimiter) if delimiter else -1
        if at >= 0:
            text = self._buffer[:at]
            body = text.rstrip()
            self._emit_content(body)
            if not self._after_call:  # content, not another call, came before this one
                self._spacing = text[len(body) :]
            self._buffer = self._buffer[at + len(delimiter) :]  # type: ignore[arg-type]
            return True
        if final:
            self._emit_content(self._buffer)
            self._buffer = ""
            return False
        keep = partial_suffix(self._buffer, delimiter) if delimiter else 0
        settled = self._buffer[: len(self._buffer) - keep]
        text = settled.rstrip()
        self._emit_content(text)
        self._buffer = self._buffer[len(text) :]
        return False

    # -- JSON call objects ----------------------------------------------------------------------
    def _open_call(self, opening: str) -> None:
        """Start scanning a call object at the start of the buffer; ``opening`` is the delimiter text
        before it, given back as content if the object never gets a name."""
        self._call = _OpenCall(self.argument_keys, opening)

    def _scan_call(self, final: bool) -> str:
        """Scan the open call further and send what it settles. Returns ``"open"`` (more text is needed),
        ``"done"`` (the object closed), ``"broken"`` (it stopped before a character that cannot continue
        it, left in the buffer, or the reply ended) or ``"content"`` (it ended or failed without a name:
        its text went out as content)."""
        call = self._call
        assert call is not None
        scanner = call.scanner
        used = scanner.feed(self._buffer)
        call.raw += self._buffer[:used]
        self._buffer = self._buffer[used:]
        if call.index is None and scanner.name is None and (scanner.failed or scanner.done or final):
            self._call = None
            self._emit_content(call.raw)
            return "content"
        name = None
        if call.index is None and scanner.name is not None:
            call.index, self._calls, name = self._calls, self._calls + 1, scanner.name
        if call.index is None:
            return "open"
        piece = scanner.arguments[call.sent :]
        call.sent += len(piece)
        if scanner.done and not scanner.has_arguments:
            piece = "{}"  # a call written without arguments has none
        if name is not None or piece:
            self._deltas.append(ToolCallDelta(call.index, name, piece))
        if scanner.done:
            self._call, self._after_call = None, True
            return "done"
        if scanner.failed or final:
            self._call, self._after_call = None, True
            return "broken"
        return "open"


class JsonCallListParser(StreamingToolParser):
    """Calls as a JSON list of call objects, ``[{...}, {...}]``, after each ``list_start`` delimiter in the
    reply, or (``list_start`` None) at the very start of the reply only. Text outside the lists is content,
    and so is a list whose first item is not a call."""

    list_start: ClassVar[str | None] = None

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]]) -> None:
        super().__init__(tokenizer, tools)
        self._list: str | None = None if self.list_start else "open"  # "open", "item" or "next" inside a list
        self._opening = ""  # the list's text before its first call: content if no call follows

    def _advance(self, final: bool) -> None:
        while True:
            if self._call is not None:
                state = self._scan_call(final)
                if state == "open":
                    return
                self._list = "next" if state == "done" else None
            elif self._list is not None:
                text = self._buffer.lstrip()
                self._opening += self._buffer[: len(self._buffer) - len(text)]
                self._buffer = text
                if not text and not final:
                    return
                self._step_list()
            elif self._take_content(self.list_start, final):
                self._list, self._opening = "open", self.list_start  # type: ignore[assignment]
            else:
                return

    def _step_list(self) -> None:
        """One token of the list around its call objects (the buffer starts with it, if not empty)."""
        char = self._buffer[:1]
        if self._list == "open" and char == "[":
            self._list, self._opening, self._buffer = "item", self._opening + char, self._buffer[1:]
        elif self._list == "item" and char == "{":
            self._open_call(self._opening)
            self._opening = ""
        elif self._list == "next" and char and char in ",]":
            self._list, self._buffer = ("item" if char == "," else None), self._buffer[1:]
        else:  # not a list of calls, or the reply ended: content from here (with the list's opening)
            self._emit_content(self._opening)
            self._list, self._opening = None, ""
