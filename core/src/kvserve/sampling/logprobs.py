"""Logprobs of the chosen tokens and the top-N, from the raw or the processed distribution."""

from __future__ import annotations

from typing import Literal

import torch

from kvserve.outputs import Logprob, TokenLogprobs
from kvserve.request import Request
from kvserve.sampling.draw import nucleus_probs, row_topk

LogprobsMode = Literal["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"]
"""As vLLM's ``logprobs_mode``: the model's distribution before any processing (raw) or the one the
token was drawn from (processed: after masks, bias, penalties, temperature, top-k/top-p/min-p), as
log-probabilities or as logits."""


def truncated_logits(scaled: torch.Tensor, requests: list[Request]) -> torch.Tensor:
    """Temperature-scaled logits of sampled rows with the tokens outside each row's min-p, top-k and
    top-p support set to ``-inf``: explicitly, for reporting (the draw never builds this)."""
    vocab = scaled.shape[1]
    probs = scaled.softmax(dim=-1)
    keep = torch.ones_like(scaled, dtype=torch.bool)
    min_p = torch.tensor([r.sampling_params.min_p for r in requests], device=scaled.device).unsqueeze(1)
    keep &= probs >= probs.amax(dim=-1, keepdim=True) * min_p
    for row, request in enumerate(requests):
        k = request.sampling_params.top_k
        if 0 < k < vocab:
            keep[row] &= scaled[row] >= scaled[row].topk(k).values[-1]
    if any(r.sampling_params.top_p < 1.0 for r in requests):
        keep &= nucleus_probs(probs * keep, requests) > 0
    return scaled.masked_fill(~keep, float("-inf"))


def token_logprobs(values: torch.Tensor, targets: torch.Tensor, top_ns: list[int]) -> list[TokenLogprobs]:
    """Per row of ``values`` (log-probabilities or logits): ``targets[row]``'s value and rank plus the top
    ``top_ns[row]``."""
    chosen = values.gather(1, targets.unsqueeze(1)).squeeze(1)
    ranks = (values > chosen.unsqueeze(1)).sum(dim=-1, dtype=torch.int32) + 1  # int32: no int64 copy of the mask
    widest = max(top_ns, default=0)
    top_values, top_ids = row_topk(values, widest) if widest else (values[:, :0], targets[:, None][:, :0])
    # one host copy of each: reading the tensors element by element cost more than the topk
    rows = zip(targets.tolist(), chosen.tolist(), ranks.tolist(), top_values.tolist(), top_ids.tolist(), top_ns)
    result = []
    for target, value, rank, best_values, best_ids, top_n in rows:
        entry = {target: Logprob(value, rank)}
        for place in range(top_n):
            entry.setdefault(best_ids[place], Logprob(best_values[place], place + 1))
        result.append(entry)
    return result
