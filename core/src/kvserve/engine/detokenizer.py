"""Incremental detokenization with the tokenizers library's DecodeStream."""

from __future__ import annotations

from typing import Any

from tokenizers.decoders import DecodeStream


class IncrementalDetokenizer:
    """Turns a request's generated tokens into text as they arrive.

    DecodeStream holds back bytes of an unfinished multi-byte character, so a streamed
    chunk never ends inside one.
    """

    def __init__(self, tokenizer: Any, skip_special_tokens: bool) -> None:
        self._backend = tokenizer.backend_tokenizer
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self.text = ""

    def add(self, token_id: int) -> str:
        """Feed one token; returns the text it completes (possibly empty)."""
        piece = self._stream.step(self._backend, token_id) or ""
        self.text += piece
        return piece
