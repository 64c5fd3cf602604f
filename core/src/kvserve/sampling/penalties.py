"""Repetition, presence and frequency penalties."""

from __future__ import annotations

from collections import Counter

import torch

from kvserve.sampling.batch import SamplingBatch
from kvserve.sampling.stage import SamplerStage


class PenaltiesStage(SamplerStage):
    """Repetition penalty over prompt + output (HF semantics); presence/frequency over output (OpenAI).

    Works on the tokens each row has seen, never on a ``[rows, vocab]`` scratch tensor.
    """

    name = "penalties"

    def wants(self, batch: SamplingBatch) -> bool:
        return any(r.sampling_params.uses_penalties for r in batch.requests)

    def apply(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        device = logits.device
        rows = [i for i, r in enumerate(batch.requests) if r.sampling_params.uses_penalties]
        seen_ids, repetition, output_ids, output_adjust = [], [], [], []
        for row in rows:
            request = batch.requests[row]
            params = request.sampling_params
            seen_ids.append(request.prompt_token_ids + request.output_token_ids)
            repetition.append(params.repetition_penalty)
            counts = Counter(request.output_token_ids)
            output_ids.append(list(counts) or [0])
            adjust = [params.frequency_penalty * c + params.presence_penalty for c in counts.values()]
            output_adjust.append(adjust or [0.0])
        index = torch.tensor(rows, device=device)
        sub = logits[index]
        ids = _padded(seen_ids, device)
        seen = sub.gather(1, ids)
        penalty = torch.tensor(repetition, device=device).unsqueeze(1)
        sub.scatter_(1, ids, torch.where(seen > 0, seen / penalty, seen * penalty))  # repeats write equal values
        sub.scatter_add_(1, _padded(output_ids, device), -_padded(output_adjust, device, fill=0.0))
        logits[index] = sub
        return logits


def _padded(lists: list[list], device: torch.device, fill=None) -> torch.Tensor:
    """Rows of unequal length as one tensor, padded with ``fill`` (default: the row's first item)."""
    width = max(len(values) for values in lists)
    rows = [values + [values[0] if fill is None else fill] * (width - len(values)) for values in lists]
    return torch.tensor(rows, device=device)
