"""Chat answers split into ``reasoning_content`` and ``content`` by the server's reasoning parser
(``--reasoning-parser``); without one, answers are plain messages as before."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvserve.interfaces.reasoning_parser import ReasoningParser
from kvserve.server.protocol import AssistantMessage, DeltaMessage


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

    def message(self, index: int, text: str) -> AssistantMessage:
        """Choice ``index``'s whole answer."""
        if self.parser_class is None:
            return AssistantMessage(content=text)
        reasoning, content = self._parser(index).extract_reasoning(text)
        return ReasoningMessage(reasoning_content=reasoning, content=content)

    def delta(self, index: int, text: str, finished: bool) -> DeltaMessage:
        """Choice ``index``'s next delta; ``finished``: its last, which also hands out any text held back."""
        if self.parser_class is None:
            return DeltaMessage(content=text)
        parser = self._parser(index)
        parts = [parser.extract_reasoning_streaming(text), parser.finish_streaming() if finished else (None, None)]
        reasoning = "".join(r for r, _ in parts if r) or None
        content = "".join(c for _, c in parts if c) or None
        return ReasoningDelta(reasoning_content=reasoning, content=content)
