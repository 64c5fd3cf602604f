"""The engine's per-token ``TokenLogprobs`` in OpenAI's two shapes: legacy completions and chat."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvserve.outputs import TokenLogprobs
from kvserve.server.protocol import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob

LOGPROB_FLOOR = -9999.0
"""JSON has no ``-inf``; an impossible token reports this instead (as vLLM does)."""


def _value(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR)


def completion_logprobs(
    tokenizer: Any, token_ids: Sequence[int], logprobs: Sequence[TokenLogprobs | None], text_offset: int
) -> CompletionLogprobs:
    """``tokens``/``token_logprobs``/``top_logprobs``/``text_offset`` for ``token_ids``.

    ``text_offset`` is where the first token starts in the choice's text; a ``None`` entry
    (the first prompt token, which nothing predicts) reports null logprobs.
    """
    result = CompletionLogprobs()
    for token_id, entry in zip(token_ids, logprobs):
        text = tokenizer.decode([token_id])
        result.tokens.append(text)
        result.text_offset.append(text_offset)
        text_offset += len(text)
        if entry is None:
            result.token_logprobs.append(None)
            result.top_logprobs.append(None)
            continue
        result.token_logprobs.append(_value(entry[token_id].logprob))
        # The chosen token plus the top N, as OpenAI's legacy API reports them. Tokens that decode
        # alike (partial characters) share a key: the chosen one, then the likelier, keeps it.
        top: dict[str, float] = {}
        for candidate, logprob in entry.items():
            top.setdefault(tokenizer.decode([candidate]), _value(logprob.logprob))
        result.top_logprobs.append(top)
    return result


def chat_logprobs(
    tokenizer: Any, token_ids: Sequence[int], logprobs: Sequence[TokenLogprobs], top_n: int
) -> ChatLogprobs:
    """``{"content": [{token, logprob, bytes, top_logprobs}]}``; ``top_logprobs`` holds the ``top_n`` most likely."""

    def entry(token_id: int, logprob: float) -> TopLogprob:
        text = tokenizer.decode([token_id])
        return TopLogprob(token=text, logprob=_value(logprob), bytes=list(text.encode()))

    content = []
    for token_id, candidates in zip(token_ids, logprobs):
        chosen = entry(token_id, candidates[token_id].logprob)
        ranked = sorted(candidates.items(), key=lambda item: item[1].rank)[:top_n]
        top = [entry(t, lp.logprob) for t, lp in ranked]
        content.append(ChatTokenLogprob(**chosen.model_dump(), top_logprobs=top))
    return ChatLogprobs(content=content)
