"""The ReasoningParser interface: splits a reasoning model's output into its reasoning and its answer.

Reasoning models (DeepSeek R1, Qwen3, ...) think aloud before they answer, the thinking marked by
tokens such as ``<think>…</think>``. With ``--reasoning-parser NAME`` the chat API returns the
thinking as ``reasoning_content`` apart from ``content`` (streamed as deltas of each), and a
structured-output constraint applies only to the answer, once the reasoning has ended.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar


class ReasoningParser(ABC):
    """Reads one model output: split whole, or streamed delta by delta.

    Built by ``cls(tokenizer, chat_template_kwargs)`` for each output (each choice of a chat
    request), so the streaming state is that output's alone:

    - ``tokenizer``: the engine's HF tokenizer, to find the ids of the reasoning markers;
    - ``chat_template_kwargs``: the request's template variables (e.g. Qwen3's
      ``{"enable_thinking": False}``), or None; a parser honours those that switch reasoning off.

    Both forms must agree: the reasoning deltas of a stream, joined, are the non-streamed
    reasoning, and the same for the content, however the text is cut into deltas (the contract,
    ``kvserve.testing.ReasoningParserContract``, checks every cut of canned outputs).
    """

    name: ClassVar[str]
    """The registry name (``--reasoning-parser``)."""

    def __init__(self, tokenizer: Any, chat_template_kwargs: Mapping[str, Any] | None = None) -> None:
        """Keep the tokenizer and the request's template variables (as :attr:`tokenizer` and
        :attr:`chat_template_kwargs`, an empty dict for None)."""
        self.tokenizer = tokenizer
        self.chat_template_kwargs: dict[str, Any] = dict(chat_template_kwargs or {})

    @abstractmethod
    def extract_reasoning(self, text: str) -> tuple[str | None, str | None]:
        """``(reasoning_content, content)`` of a whole output, the markers left out; None for a part
        that is empty. Does not touch the streaming state."""

    @abstractmethod
    def extract_reasoning_streaming(self, delta_text: str) -> tuple[str | None, str | None]:
        """The next text delta of the output in; ``(reasoning delta, content delta)`` out, None for
        nothing. Text that may be the start of a marker (``"</thi"``) may be held back until a
        later delta or :meth:`finish_streaming` tells what it is."""

    @abstractmethod
    def finish_streaming(self) -> tuple[str | None, str | None]:
        """The output has ended: ``(reasoning delta, content delta)`` of any text still held back.
        The parser is then ready to stream a new output."""

    @abstractmethod
    def is_reasoning_end(self, token_ids: Sequence[int]) -> bool:
        """Whether the reasoning has ended by the end of ``token_ids`` (a prompt, or a prompt and what
        followed it): the last reasoning marker in them ends the reasoning, or reasoning is off.

        Asked once per request with the prompt's ids, before anything is generated: a template may
        close the reasoning in the prompt itself (Qwen3's does with thinking off)."""

    @property
    @abstractmethod
    def reasoning_end_token_ids(self) -> Sequence[int]:
        """The token ids that end the reasoning (``</think>``'s), never empty. A structured-output
        constraint starts after the model emits them in this order; tokens that spell the marker
        some other way are not recognized."""
