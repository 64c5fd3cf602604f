"""``no_repeat_ngram``: a batch-level logits processor that bans repeating an n-gram, as HF's
``no_repeat_ngram_size``. A request opts in with ``extra_args={"no_repeat_ngram_size": n}``."""

from __future__ import annotations

import torch

from kvserve.interfaces.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality
from kvserve.sampling_params import SamplingParams

EXTRA_ARG = "no_repeat_ngram_size"


class NoRepeatNGramLogitsProcessor(LogitsProcessor):
    """Bans every token that would complete an n-gram already present in the request's prompt and
    output (HF's ``NoRepeatNGramLogitsProcessor`` semantics, over the whole sequence)."""

    def __init__(self, config, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.rows: dict[int, tuple[int, list[int], list[int]]] = {}
        """Batch index -> (n, prompt ids, live output ids) of the rows that opted in."""

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        size = (params.extra_args or {}).get(EXTRA_ARG)
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
            raise ValueError(f"extra_args.{EXTRA_ARG}: must be a positive integer, got {size!r}")

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, prompt, output in batch_update.added:
            size = (params.extra_args or {}).get(EXTRA_ARG)
            if size:
                self.rows[index] = (size, list(prompt or ()), output)
            else:
                self.rows.pop(index, None)
        for source, target, direction in batch_update.moved:
            moving = self.rows.pop(source, None)
            if direction is MoveDirectionality.SWAP:
                other = self.rows.pop(target, None)
                if other is not None:
                    self.rows[source] = other
            else:
                self.rows.pop(target, None)
            if moving is not None:
                self.rows[target] = moving

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, (size, prompt, output) in self.rows.items():
            banned = _banned(prompt + output, size)
            if banned:
                logits[index, banned] = float("-inf")
        return logits


def _banned(tokens: list[int], size: int) -> list[int]:
    """Tokens that, appended to ``tokens``, would repeat one of its ``size``-grams."""
    if len(tokens) + 1 < size:
        return []
    prefix = tuple(tokens[len(tokens) - size + 1 :]) if size > 1 else ()
    return [tokens[i + size - 1] for i in range(len(tokens) - size + 1) if tuple(tokens[i : i + size - 1]) == prefix]
