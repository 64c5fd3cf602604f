"""The server's door: caps and bounds checked on a parsed body before anything is tokenized, decoded or queued.

Every check answers 400 in OpenAI's shape naming the field, whatever the engine would make
of the value: the HTTP answer does not depend on how deep inside the engine a bad value
would have failed. The caps are ``ServerConfig`` fields; the bounds are vLLM's and OpenAI's.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvserve.config import ServerConfig
from kvserve.server.errors import OpenAIError
from kvserve.server.protocol import INT64_MAX, INT64_MIN, GenerationRequest


def _invalid(field: str, message: str, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(400, f"{field}: {message}", param=field, code=code)


class RequestLimits:
    """The caps of ``config`` and the model's vocabulary, applied to one generation request."""

    def __init__(self, config: ServerConfig, vocab_size: int) -> None:
        self.config = config
        self.vocab_size = vocab_size

    def check(self, body: GenerationRequest, num_prompts: int, prompt_ids: Iterable[list[int]] = ()) -> None:
        """Raise a 400 for the first field out of bounds.

        ``num_prompts`` counts the request's prompts (a chat request has one); ``prompt_ids``
        are those given as token ids, checked here because echo decodes them.
        """
        body.check_supported()
        n = 1 if body.n is None else body.n
        self.check_sequences(n, num_prompts)
        if body.seed is not None and not INT64_MIN <= body.seed <= INT64_MAX - max(n - 1, 0):
            also = f" (with n={n}, seed + {n - 1} too: each sequence gets seed + its index)" if n > 1 else ""
            raise _invalid("seed", f"must lie within int64 [-2**63, 2**63 - 1]{also}; got {body.seed}")
        if body.top_k is not None and not (body.top_k in (-1, 0) or 1 <= body.top_k <= self.vocab_size):
            raise _invalid(
                "top_k", f"must be -1 or 0 (no top-k) or within 1..{self.vocab_size} (the vocabulary); got {body.top_k}"
            )
        for ids in prompt_ids:
            self.check_token_ids("prompt", ids)
        self.check_token_ids("stop_token_ids", body.stop_token_ids or [])
        self.check_token_ids("allowed_token_ids", body.allowed_token_ids or [])
        self.check_token_ids("logit_bias", body.logit_bias_ids())
        stop = [body.stop] if isinstance(body.stop, str) else body.stop or []
        self._check_strings("stop", stop, self.config.max_stop_strings, self.config.max_stop_string_length)
        bad_words = body.bad_words or []
        if "" in bad_words:
            raise _invalid("bad_words", "entries must not be empty")
        self._check_strings("bad_words", bad_words, self.config.max_bad_words, self.config.max_bad_word_length)

    def check_sequences(self, n: int, num_prompts: int) -> None:
        """At most ``max_sequences_per_request`` sequences (``n`` per prompt); n < 1 is SamplingParams' to refuse."""
        cap = self.config.max_sequences_per_request
        if n >= 1 and n * num_prompts > cap:
            raise _invalid(
                "n",
                f"n ({n}) x prompts ({num_prompts}) = {n * num_prompts} sequences exceeds this server's "
                f"limit of {cap} per request (max_sequences_per_request)",
                code="too_many_sequences",
            )

    def check_token_ids(self, field: str, ids: Iterable[int]) -> None:
        """Every id within the vocabulary ``[0, vocab_size)``."""
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise _invalid(field, f"token ids {bad[:5]} outside the vocabulary [0, {self.vocab_size})")

    @staticmethod
    def _check_strings(field: str, values: list[str], max_count: int, max_length: int) -> None:
        if len(values) > max_count:
            raise _invalid(field, f"{len(values)} entries; this server takes at most {max_count}")
        longest = max(map(len, values), default=0)
        if longest > max_length:
            raise _invalid(field, f"an entry of {longest} characters; this server takes at most {max_length}")
