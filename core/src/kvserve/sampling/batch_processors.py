"""The engine's batch-level logits processors (vLLM v1's interface), as one stage."""

from __future__ import annotations

import torch

from kvserve.interfaces.logits_processor import BatchUpdate, LogitsProcessor
from kvserve.request import Request
from kvserve.sampling.batch import SamplingBatch
from kvserve.sampling.stage import SamplerStage


def batch_update(previous: list[Request], current: list[Request]) -> BatchUpdate | None:
    """The change from last step's rows to this step's, index by index: a row whose request differs is
    removed (if one was there) and the new request added at that index; no moves. None: no change."""
    removed = [i for i, r in enumerate(previous) if i >= len(current) or current[i] is not r]
    added = [
        (i, r.sampling_params, r.prompt_token_ids, r.output_token_ids)
        for i, r in enumerate(current)
        if i >= len(previous) or previous[i] is not r
    ]
    if not removed and not added:
        return None
    return BatchUpdate(batch_size=len(current), removed=removed, added=added, moved=[])


class BatchLogitsProcessorsStage(SamplerStage):
    """Tells every processor how the rows changed, then applies them in order. A processor that
    raises fails the step (it is the engine's configuration, not one request's)."""

    name = "batch_logits_processors"

    def __init__(self, processors: list[LogitsProcessor]) -> None:
        self.processors = processors
        self._rows: list[Request] = []

    def wants(self, batch: SamplingBatch) -> bool:
        return True  # every step: the processors track the batch even when they change nothing

    def apply(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        update = batch_update(self._rows, batch.requests)
        self._rows = list(batch.requests)
        all_greedy = not batch.sampled_rows
        for processor in self.processors:
            processor.update_state(update)
            if not (all_greedy and processor.is_argmax_invariant()):
                logits = processor.apply(logits)
        return logits
