"""Structured outputs after reasoning: a grammar constrains the answer, never the thinking before it.

The engine, on creating a request's grammar matcher while a reasoning parser is configured
(``EngineConfig.server.reasoning_parser``), passes it through :func:`constrain_after_reasoning`
and hands the sampler what comes back, as vLLM's structured-output manager does with its
reasoner. The parser is built once per engine, ``load_reasoning_parser(name, tokenizer)``: only
its stateless methods are used here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvserve.interfaces.logits_constraint import LogitsConstraint

if TYPE_CHECKING:
    import torch

    from kvserve.interfaces.reasoning_parser import ReasoningParser


def constrain_after_reasoning(
    matcher: LogitsConstraint, parser: ReasoningParser | None, prompt_token_ids: Sequence[int]
) -> LogitsConstraint:
    """``matcher`` as the request should be constrained: unchanged without a parser or when the prompt
    already ended the reasoning (``parser.is_reasoning_end(prompt_token_ids)``, e.g. Qwen3's template
    with thinking off), else wrapped in a :class:`ReasoningGatedConstraint` that lets the reasoning
    run free and starts ``matcher`` at the first token after ``parser.reasoning_end_token_ids``."""
    if parser is None or parser.is_reasoning_end(prompt_token_ids):
        return matcher
    return ReasoningGatedConstraint(matcher, parser.reasoning_end_token_ids)


class ReasoningGatedConstraint(LogitsConstraint):
    """Allows every token until the accepted tokens end with ``end_token_ids``, then is ``inner``.

    The inner constraint sees only the answer: it accepts the tokens after the reasoning's end, in
    the same :meth:`accept_tokens` call when the end falls inside one. A rollback first undoes the
    answer's tokens in ``inner``, then the reasoning's here (reopening the reasoning if its end is
    undone), so speculative drafts may straddle the boundary.
    """

    def __init__(self, inner: LogitsConstraint, end_token_ids: Sequence[int]) -> None:
        """Gate ``inner`` (a fresh matcher, at its grammar's start) behind ``end_token_ids`` (not empty)."""
        if not end_token_ids:
            raise ValueError("end_token_ids: the reasoning must end with at least one token")
        self.inner = inner
        self._end = tuple(end_token_ids)
        self._reasoning: list[int] = []
        """Tokens accepted while reasoning, the end marker included once it came."""
        self._answer_tokens = 0
        """Tokens ``inner`` accepted (what a rollback undoes there first)."""
        self._ended = False

    @property
    def reasoning_ended(self) -> bool:
        """Whether the end marker has been accepted (the grammar is in force)."""
        return self._ended

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Every token while reasoning (all bits set); the inner constraint's mask after."""
        if self._ended:
            self.inner.fill_bitmask(bitmask, row)
        else:
            bitmask[row].fill_(-1)

    def accept_tokens(self, token_ids: list[int]) -> bool:
        """Reasoning tokens are always allowed; those after the end marker go to the inner constraint,
        whose answer (False: a token it did not allow) this returns."""
        for position, token in enumerate(token_ids):
            if self._ended:
                answer = token_ids[position:]
                if not self.inner.accept_tokens(answer):
                    return False
                self._answer_tokens += len(answer)
                return True
            self._reasoning.append(token)
            self._ended = tuple(self._reasoning[-len(self._end) :]) == self._end
        return True

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens, across the reasoning's end if need be."""
        if num_tokens > self._answer_tokens + len(self._reasoning):
            raise ValueError(
                f"cannot roll back {num_tokens} tokens: only {self._answer_tokens + len(self._reasoning)} accepted"
            )
        in_answer = min(num_tokens, self._answer_tokens)
        if in_answer:
            self.inner.rollback(in_answer)
            self._answer_tokens -= in_answer
        in_reasoning = num_tokens - in_answer
        if in_reasoning:
            del self._reasoning[-in_reasoning:]
            self._ended = False  # the end marker's last token was the last reasoning token

    def is_terminated(self) -> bool:
        """Never while reasoning; the inner constraint's answer after."""
        return self._ended and self.inner.is_terminated()

    def reset(self) -> None:
        """Back to reasoning, with the inner constraint at its start."""
        self.inner.reset()
        self._reasoning.clear()
        self._answer_tokens = 0
        self._ended = False
