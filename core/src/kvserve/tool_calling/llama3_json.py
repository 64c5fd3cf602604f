"""``llama3_json``: Llama 3.1 / 3.2's JSON tool calls, ``{"name": ..., "parameters": {...}}``, the whole reply
(after an optional ``<|python_tag|>``), several separated by ``;``."""

from __future__ import annotations

from kvserve.tool_calling.base import StreamingToolParser

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(StreamingToolParser):
    """Calls only at the start of the reply: JSON objects with ``name`` and ``parameters`` (or
    ``arguments``), separated by ``;`` or whitespace. A reply that starts otherwise is all content, and so
    is the text after the calls. ``<|python_tag|>`` is a special token, so the reply keeps special tokens."""

    name = "llama3_json"
    argument_keys = ("parameters", "arguments")

    def __init__(self, tokenizer, tools) -> None:
        super().__init__(tokenizer, tools)
        self._state = "start"  # "start", "tag" (after <|python_tag|> or ";"), "next" (after a call), "content"
        self._opening = ""  # text before the next object: content if no call follows

    def adjust_sampling_params(self, params):
        return params.model_copy(update={"skip_special_tokens": False})

    def _advance(self, final: bool) -> None:
        while True:
            if self._call is not None:
                state = self._scan_call(final)
                if state == "open":
                    return
                self._state = "next" if state == "done" else "content"
                continue
            if self._state == "content":
                self._take_content(None, final)
                return
            text = self._buffer.lstrip()
            skipped = self._buffer[: len(self._buffer) - len(text)]
            if self._state == "start" and text.startswith(PYTHON_TAG):
                self._opening, self._buffer, self._state = skipped + PYTHON_TAG, text[len(PYTHON_TAG) :], "tag"
            elif self._state == "next" and text.startswith(";"):
                self._opening, self._buffer, self._state = ";", text[1:], "tag"
            elif text.startswith("{"):
                self._open_call(self._opening + skipped)
                self._opening, self._buffer = "", text
            elif not final and (not text or (self._state == "start" and PYTHON_TAG.startswith(text))):
                return  # nothing settled yet, or the tag may be coming
            else:
                self._emit_content(self._opening)
                self._opening, self._state = "", "content"
