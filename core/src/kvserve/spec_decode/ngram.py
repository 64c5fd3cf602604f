"""The ``ngram`` proposer: prompt lookup over the request's own tokens (vLLM's ``method: ngram``).

The last ``n`` tokens (``n`` from ``prompt_lookup_max`` down to ``prompt_lookup_min``) are looked
up earlier in the prompt and output; the tokens that followed the most recent earlier occurrence
are the drafts. Copy-heavy work (editing code, quoting a document) repeats long stretches of its
context, so those guesses are often right; elsewhere nothing matches and nothing is proposed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvserve.config import SpeculativeConfig
from kvserve.interfaces.proposer import DraftProposer, DraftRequest


class NgramProposer(DraftProposer):
    """Stateless but for a per-request int32 copy of the tokens, extended as the request grows."""

    name = "ngram"

    def __init__(self, config: SpeculativeConfig, vocab_size: int) -> None:
        super().__init__(config, vocab_size)
        # Both set once the config is validated (one bound defaults to the other).
        self.min_n, self.max_n = config.prompt_lookup_min, config.prompt_lookup_max
        self._tokens: dict[str, tuple[np.ndarray, int]] = {}  # request id -> (buffer, tokens in it)

    def propose(self, requests: Sequence[DraftRequest], num_tokens: Sequence[int]) -> list[list[int]]:
        return [self._propose_one(r, k) if k > 0 else [] for r, k in zip(requests, num_tokens, strict=True)]

    def forget(self, request_id: str) -> None:
        self._tokens.pop(request_id, None)

    def _propose_one(self, request: DraftRequest, k: int) -> list[int]:
        tokens = self._token_array(request)
        size = len(tokens)
        for n in range(min(self.max_n, size - 1), self.min_n - 1, -1):
            # Windows starting at 0 .. size - n - 1: every earlier occurrence, none ending at the suffix itself.
            windows = np.lib.stride_tricks.sliding_window_view(tokens[: size - 1], n)
            hits = np.flatnonzero((windows == tokens[size - n :]).all(axis=1))
            if len(hits):
                start = int(hits[-1]) + n  # the most recent occurrence: what followed it
                return tokens[start : start + k].tolist()
        return []

    def _token_array(self, request: DraftRequest) -> np.ndarray:
        """Prompt + output as int32, kept per request and extended by the new tokens only (a
        preempted and recomputed request has the same tokens, so the copy stays valid)."""
        prompt, output = request.prompt_token_ids, request.output_token_ids
        size = len(prompt) + len(output)
        buffer, filled = self._tokens.get(request.request_id, (None, 0))
        if buffer is None or filled > size or filled < len(prompt):
            buffer, filled = np.empty(max(2 * size, 64), dtype=np.int32), len(prompt)
            buffer[:filled] = prompt
        if size > len(buffer):
            grown = np.empty(2 * size, dtype=np.int32)
            grown[:filled] = buffer[:filled]
            buffer = grown
        buffer[filled:size] = output[filled - len(prompt) :]
        self._tokens[request.request_id] = (buffer, size)
        return buffer[:size]
