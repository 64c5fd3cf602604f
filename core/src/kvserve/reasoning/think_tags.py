"""Reasoning marked by a pair of tags, ``<think>…</think>``: core's ``deepseek_r1`` and ``qwen3`` parsers.

:class:`ThinkTagReasoningParser` is the shared machinery, public so that a plugin for another
model family with the same shape only sets the tags and where its output starts.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from kvserve.interfaces.reasoning_parser import ReasoningParser


class _Phase(enum.Enum):
    OPENING = enum.auto()
    """Output that starts inside the reasoning, before we know whether it repeats the start tag."""
    BEFORE = enum.auto()
    """Content before the start tag (output that reasons only after a start tag)."""
    REASONING = enum.auto()
    ANSWER = enum.auto()
    """After the end tag: everything is content."""


class ThinkTagReasoningParser(ReasoningParser):
    """Reasoning between :attr:`start_tag` and the first :attr:`end_tag` after it; all else is content.

    With :attr:`starts_in_reasoning` the output begins inside the reasoning (the chat template
    wrote the start tag into the prompt) and a start tag the model repeats at the very beginning
    is dropped; without it, output with no start tag has no reasoning. Text after the end tag is
    content even if it holds more tags. Tags are matched in the text, so they are found however
    the tokenizer spells them; :attr:`reasoning_end_token_ids` is the end tag's own encoding.
    """

    start_tag: ClassVar[str] = "<think>"
    end_tag: ClassVar[str] = "</think>"
    starts_in_reasoning: ClassVar[bool] = False

    def __init__(self, tokenizer: Any, chat_template_kwargs: Mapping[str, Any] | None = None) -> None:
        super().__init__(tokenizer, chat_template_kwargs)
        self._start_ids = tuple(tokenizer.encode(self.start_tag, add_special_tokens=False))
        self._end_ids = tuple(tokenizer.encode(self.end_tag, add_special_tokens=False))
        self._phase = self._first_phase()
        self._pending = ""
        """Streamed text not yet handed out: the part that may be the beginning of a tag."""

    def thinking_enabled(self) -> bool:
        """False when the request switched reasoning off; then the whole output is content."""
        return True

    @property
    def reasoning_end_token_ids(self) -> Sequence[int]:
        """The end tag's token ids."""
        return self._end_ids

    def extract_reasoning(self, text: str) -> tuple[str | None, str | None]:
        """Reasoning between the start tag (or the output's start) and the end tag; content around it."""
        if not self.thinking_enabled():
            return None, text or None
        if self.starts_in_reasoning:
            before, rest = "", text.removeprefix(self.start_tag)
        else:
            before, found, rest = text.partition(self.start_tag)
            if not found:
                return None, text or None
        reasoning, _, after = rest.partition(self.end_tag)
        return reasoning or None, (before + after) or None

    def extract_reasoning_streaming(self, delta_text: str) -> tuple[str | None, str | None]:
        """The delta's text, routed by the phase the stream is in; a possible tag beginning waits."""
        self._pending += delta_text
        reasoning: list[str] = []
        content: list[str] = []
        while True:
            if self._phase is _Phase.OPENING:
                if self._pending.startswith(self.start_tag):
                    self._pending = self._pending[len(self.start_tag) :]
                elif self.start_tag.startswith(self._pending):
                    break  # may still become the start tag
                self._phase = _Phase.REASONING
            elif self._phase is _Phase.BEFORE:
                text, found = self._take_until(self.start_tag)
                content.append(text)
                if not found:
                    break
                self._phase = _Phase.REASONING
            elif self._phase is _Phase.REASONING:
                text, found = self._take_until(self.end_tag)
                reasoning.append(text)
                if not found:
                    break
                self._phase = _Phase.ANSWER
            else:
                content.append(self._pending)
                self._pending = ""
                break
        return "".join(reasoning) or None, "".join(content) or None

    def finish_streaming(self) -> tuple[str | None, str | None]:
        """Text held back as a possible tag is what it looked like it continued: reasoning or content."""
        text, self._pending = self._pending, ""
        in_reasoning = self._phase in (_Phase.OPENING, _Phase.REASONING)
        self._phase = self._first_phase()
        return (text or None, None) if in_reasoning else (None, text or None)

    def is_reasoning_end(self, token_ids: Sequence[int]) -> bool:
        """The end tag's ids occur after the start tag's last occurrence (always, with thinking off)."""
        if not self.thinking_enabled():
            return True
        end = _last_occurrence(token_ids, self._end_ids)
        return end >= 0 and end > _last_occurrence(token_ids, self._start_ids)

    def _first_phase(self) -> _Phase:
        if not self.thinking_enabled():
            return _Phase.ANSWER
        return _Phase.OPENING if self.starts_in_reasoning else _Phase.BEFORE

    def _take_until(self, tag: str) -> tuple[str, bool]:
        """The pending text before ``tag`` (consumed with the tag) and True; without the tag, all of it
        but a tail that may be the tag's beginning, and False."""
        before, found, after = self._pending.partition(tag)
        if found:
            self._pending = after
            return before, True
        keep = next((n for n in range(min(len(tag) - 1, len(before)), 0, -1) if before.endswith(tag[:n])), 0)
        cut = len(before) - keep
        text, self._pending = before[:cut], before[cut:]
        return text, False


def _last_occurrence(token_ids: Sequence[int], pattern: Sequence[int]) -> int:
    """Start index of the last occurrence of ``pattern`` in ``token_ids``; -1 if none."""
    size = len(pattern)
    for start in range(len(token_ids) - size, -1, -1):
        if all(token_ids[start + i] == pattern[i] for i in range(size)):
            return start
    return -1


class DeepSeekR1ReasoningParser(ThinkTagReasoningParser):
    """DeepSeek R1 (and QwQ, and Qwen3 "Thinking" checkpoints): the template opens ``<think>`` in the
    prompt, so the output starts inside the reasoning and ``</think>`` ends it. Output with no
    ``</think>`` (cut short) is all reasoning."""

    name = "deepseek_r1"
    starts_in_reasoning = True


class Qwen3ReasoningParser(ThinkTagReasoningParser):
    """Qwen3: the model writes ``<think>…</think>`` itself; output with no ``<think>`` has no reasoning.
    ``chat_template_kwargs={"enable_thinking": False}`` (which Qwen3's template honours too) makes
    the whole output content."""

    name = "qwen3"

    def thinking_enabled(self) -> bool:
        """Off when the request's ``chat_template_kwargs`` set ``enable_thinking`` to false."""
        return self.chat_template_kwargs.get("enable_thinking", True) is not False
