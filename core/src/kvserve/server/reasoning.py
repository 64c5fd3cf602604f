"""Chat answers split into ``reasoning_content`` and ``content`` by the server's reasoning parser
(``--reasoning-parser``); without one, answers are plain messages as before."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvserve.interfaces.reasoning_parser import ReasoningParser
from kvserve.server.protocol import AssistantMessage, DeltaMessage
from kvserve.server.protocol_tools import DeltaToolCall, ToolCall


class ReasoningMessage(AssistantMessage):
    """An answer of a reasoning model: ``content`` is None when the model spent its tokens on reasoning."""

    content: str | None = None
    reasoning_content: str | None = None


class ReasoningDelta(DeltaMessage):
    reasoning_content: str | None = None


class ChatReasoning:
    """The messages of one chat request's choices: split by ``parser_class`` (one parser per streamed
    choice, built with the request's ``chat_template_kwargs``), or whole when it is None."""

    def __init__(
        self, parser_class: type[ReasoningParser] | None, tokenizer: Any, chat_template_kwargs: Mapping[str, Any] | None
    ) -> None:
        self.parser_class = parser_class
        self.tokenizer = tokenizer
        self.chat_template_kwargs = chat_template_kwargs
        self.streams: dict[int, ReasoningParser] = {}

    def _parser(self, index: int) -> ReasoningParser:
        if index not in self.streams:
            self.streams[index] = self.parser_class(self.tokenizer, self.chat_template_kwargs)  # type: ignore[misc]
        return self.streams[index]

    def split(self, index: int, text: str) -> tuple[str | None, str | None]:
        """Choice ``index``'s whole answer as ``(reasoning, content)``; ``(None, text)`` without a parser."""
        if self.parser_class is None:
            return None, text
        return self._parser(index).extract_reasoning(text)

    def split_delta(self, index: int, text: str, finished: bool) -> tuple[str | None, str | None]:
        """Choice ``index``'s next delta as ``(reasoning, content)``; ``finished``: its last, which also
        hands out any text held back."""
        if self.parser_class is None:
            return None, text
        parser = self._parser(index)
        parts = [parser.extract_reasoning_streaming(text), parser.finish_streaming() if finished else (None, None)]
        return "".join(r for r, _ in parts if r) or None, "".join(c for _, c in parts if c) or None

    def message(
        self, reasoning: str | None, content: str | None, tool_calls: list[ToolCall] | None
    ) -> AssistantMessage:
        """A whole answer's message: with ``reasoning_content`` only when the server has a parser."""
        if self.parser_class is None:
            return AssistantMessage(content=content, tool_calls=tool_calls)
        return ReasoningMessage(reasoning_content=reasoning, content=content, tool_calls=tool_calls)

    def delta(self, reasoning: str | None, content: str | None, tool_calls: list[DeltaToolCall] | None) -> DeltaMessage:
        """A stream delta: with ``reasoning_content`` only when the server has a parser."""
        if self.parser_class is None:
            return DeltaMessage(content=content, tool_calls=tool_calls)
        return ReasoningDelta(reasoning_content=reasoning, content=content, tool_calls=tool_calls)
