"""Incremental detokenization with the tokenizers library's DecodeStream."""

from __future__ import annotations

from typing import Any

from tokenizers.decoders import DecodeStream

PRIMING_TOKENS = 5
"""Prompt tokens the stream starts from (vLLM's initial offset): enough for the decoder to know
that the first generated token is not at the start of the text."""


class IncrementalDetokenizer:
    """Turns a request's generated tokens into text as they arrive.

    The stream is primed with the end of the prompt, so a SentencePiece-style decoder keeps
    the leading space of the first generated word (it strips it only at the start of a text).
    DecodeStream holds back bytes of an unfinished multi-byte character, so a streamed chunk
    never ends inside one.
    """

    def __init__(self, tokenizer: Any, skip_special_tokens: bool, prompt_token_ids: list[int] = ()) -> None:
        self._backend = tokenizer.backend_tokenizer
        prefix = list(prompt_token_ids[-PRIMING_TOKENS:])
        self._stream = DecodeStream(ids=prefix or None, skip_special_tokens=skip_special_tokens)
        self.text = ""

    def add(self, token_id: int) -> str:
        """Feed one token; returns the text it completes (possibly empty)."""
        piece = self._stream.step(self._backend, token_id) or ""
        self.text += piece
        return piece
