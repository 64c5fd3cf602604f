"""``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, as Hermes 2/3 and Qwen 2.5 / 3
(and their chat templates) write calls; text around the tags is content."""

from __future__ import annotations

from kvserve.tool_calling.base import StreamingToolParser

START, END = "<tool_call>", "</tool_call>"


class HermesToolParser(StreamingToolParser):
    """Calls in ``<tool_call>`` tags, anywhere in the reply, each a JSON object with ``name`` and
    ``arguments``. A tag whose object has no name is content; a call whose closing tag is missing ends
    with its object."""

    name = "hermes"

    def __init__(self, tokenizer, tools) -> None:
        super().__init__(tokenizer, tools)
        self._closing = False  # a call object has ended: its closing tag may follow

    def _advance(self, final: bool) -> None:
        while True:
            if self._call is not None:
                state = self._scan_call(final)
                if state == "open":
                    return
                self._closing = state == "done"
            elif self._closing:
                rest = self._buffer.lstrip()
                if rest.startswith(END):
                    self._buffer = rest[len(END) :]
                elif not final and END.startswith(rest):
                    return  # the tag may still come
                self._closing = False
            elif self._take_content(START, final):
                self._open_call(START)
            else:
                return
