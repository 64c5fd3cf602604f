"""The per-request ``SamplingParams.logits_processors`` callables, as one stage."""

from __future__ import annotations

import inspect

import torch

from kvserve.request import Request
from kvserve.sampling.batch import SamplingBatch
from kvserve.sampling.stage import SamplerStage


class RequestLogitsProcessorsStage(SamplerStage):
    """Each row's own callables, in order, on that row: the request's code, so per-row Python by nature."""

    name = "request_logits_processors"

    def wants(self, batch: SamplingBatch) -> bool:
        return any(r.sampling_params.logits_processors for r in batch.requests)

    def apply(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        for row, request in enumerate(batch.requests):
            try:
                for processor in request.sampling_params.logits_processors:
                    logits[row] = _call(processor, request, logits[row])
            except Exception as exc:  # the request's own code: fail it, not the batch
                batch.fail(row, "processing the logits", exc)
        return logits


def _call(processor, request: Request, row: torch.Tensor) -> torch.Tensor:
    if len(inspect.signature(processor).parameters) == 3:
        return processor(request.prompt_token_ids, list(request.output_token_ids), row)
    return processor(list(request.output_token_ids), row)
