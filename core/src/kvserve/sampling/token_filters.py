"""Allowed tokens, bad words and the ``min_tokens`` ban; then logit bias."""

from __future__ import annotations

import torch

from kvserve.request import Request
from kvserve.sampling.batch import SamplingBatch
from kvserve.sampling.stage import SamplerStage


class AllowedAndBadTokensStage(SamplerStage):
    """``allowed_token_ids`` keeps only those; bad words and, before ``min_tokens``, EOS and stop tokens
    are banned. Indexed writes per affected row: most rows have none."""

    name = "allowed_and_bad_tokens"

    def wants(self, batch: SamplingBatch) -> bool:
        return any(r.sampling_params.allowed_token_ids is not None or banned_tokens(r) for r in batch.requests)

    def apply(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        allowed_rows, allowed_cols, banned_rows, banned_cols = [], [], [], []
        for row, request in enumerate(batch.requests):
            allowed = request.sampling_params.allowed_token_ids
            if allowed is not None:
                allowed_rows += [row] * len(allowed)
                allowed_cols += allowed
            banned = banned_tokens(request)
            banned_rows += [row] * len(banned)
            banned_cols += banned
        if allowed_rows:  # one indexed write each, not one per row
            at = (batch.tensor(allowed_rows, torch.long), batch.tensor(allowed_cols, torch.long))
            keep = logits[at]
            logits[at[0].unique()] = float("-inf")
            logits[at] = keep
        if banned_rows:
            logits[batch.tensor(banned_rows, torch.long), batch.tensor(banned_cols, torch.long)] = float("-inf")
        return logits


class LogitBiasStage(SamplerStage):
    """OpenAI's ``logit_bias``: added to the named tokens' logits."""

    name = "logit_bias"

    def wants(self, batch: SamplingBatch) -> bool:
        return any(r.sampling_params.logit_bias for r in batch.requests)

    def apply(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        rows, cols, values = [], [], []
        for row, request in enumerate(batch.requests):
            bias = request.sampling_params.logit_bias
            rows += [row] * len(bias)
            cols += list(bias)
            values += list(bias.values())
        at = (batch.tensor(rows, torch.long), batch.tensor(cols, torch.long))
        logits.index_put_(at, batch.tensor(values, logits.dtype), accumulate=True)
        return logits


def banned_tokens(request: Request) -> list[int]:
    """EOS/stop tokens before ``min_tokens``, and the token completing any bad word."""
    params = request.sampling_params
    banned: list[int] = []
    output = request.output_token_ids
    if len(output) < params.min_tokens:
        banned += params.stop_token_ids + ([] if params.ignore_eos else list(request.eos_token_ids))
    for word in request.bad_words_token_ids:
        prefix = word[:-1]
        if not prefix or output[len(output) - len(prefix) :] == prefix:
            banned.append(word[-1])
    return banned


def bad_word_token_ids(words: list[str], tokenizer) -> list[list[int]]:
    """Each bad word as tokens, alone and after a space (as it appears mid-sentence)."""
    sequences = []
    for word in words:
        for variant in (word, " " + word.lstrip()):
            ids = tokenizer.encode(variant, add_special_tokens=False)
            if ids and ids not in sequences:
                sequences.append(ids)
    return sequences
