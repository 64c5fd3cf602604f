"""Reasoning outputs: the ``reasoning_parser`` plugin kind's built-ins and what the server and engine use.

- :func:`reasoning_parser_class`: the class ``--reasoning-parser NAME`` selects (None when unset);
- :func:`load_reasoning_parser`: one parser for a tokenizer (the engine builds one for
  :func:`constrain_after_reasoning`, the server one per chat choice);
- :func:`constrain_after_reasoning`: a request's grammar matcher, held off until its reasoning ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvserve.interfaces.reasoning_parser import ReasoningParser
from kvserve.plugins import load_component
from kvserve.reasoning.constraint import ReasoningGatedConstraint, constrain_after_reasoning
from kvserve.reasoning.think_tags import DeepSeekR1ReasoningParser, Qwen3ReasoningParser, ThinkTagReasoningParser

KIND = "reasoning_parser"


def reasoning_parser_class(name: str | None) -> type[ReasoningParser] | None:
    """The registered parser ``name`` (raises naming the registered ones if unknown); None for None."""
    return None if name is None else load_component(KIND, name)


def load_reasoning_parser(
    name: str | None, tokenizer: Any, chat_template_kwargs: Mapping[str, Any] | None = None
) -> ReasoningParser | None:
    """A parser ``name`` for ``tokenizer`` and a request's template variables; None when ``name`` is None."""
    cls = reasoning_parser_class(name)
    return None if cls is None else cls(tokenizer, chat_template_kwargs)


__all__ = [
    "DeepSeekR1ReasoningParser",
    "Qwen3ReasoningParser",
    "ReasoningGatedConstraint",
    "ThinkTagReasoningParser",
    "constrain_after_reasoning",
    "load_reasoning_parser",
    "reasoning_parser_class",
]
