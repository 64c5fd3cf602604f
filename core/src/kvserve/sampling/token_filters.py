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
        for row, request in enumerate(batch.requests):
            allowed = request.sampling_params.allowed_token_ids
            if allowed is not None:
                keep = logits[row, allowed]
                logits[row] = float("-inf")
                logits[row, allowed] = keep
            banned = banned_tokens(request)
            if banned:
                logits[row, banned] = float("-inf")
        return logits


class LogitBiasStage(SamplerStage):
    """OpenAI's ``logit_bias``: added to the named tokens' logits."""

    name = "logit_bias"

    def wants(self, batch: SamplingBatch) -> bool:
        return any(r.sampling_params.logit_bias for r in batch.requests)

    def apply(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        for row, request in enumerate(batch.requests):
            bias = request.sampling_params.logit_bias
            if bias:
                ids = torch.tensor(list(bias), dtype=torch.long, device=logits.device)
                logits[row, ids] += torch.tensor(list(bias.values()), dtype=logits.dtype, device=logits.device)
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
