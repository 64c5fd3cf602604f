"""The rows of one sampling call and what the stages learn of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from kvserve.errors import UnsatisfiableRequestError
from kvserve.request import Request


@dataclass
class SamplingBatch:
    """Row ``i`` of the logits belongs to ``requests[i]``; per-row facts are computed once, on demand."""

    requests: list[Request]
    device: torch.device
    errors: dict[int, str] = field(default_factory=dict)
    invalid_rows: set[int] = field(default_factory=set)
    """Rows among ``errors`` failed by their request's own parameters (:class:`UnsatisfiableRequestError`)."""
    """Row -> what failed while processing its logits (its request must be failed)."""

    def fail(self, row: int, what: str, exc: Exception) -> None:
        """Record that ``row``'s processing failed (``what`` failed with ``exc``); the row is still sampled,
        its token ignored."""
        self.errors.setdefault(row, f"{what} failed: {type(exc).__name__}: {exc}")
        if isinstance(exc, UnsatisfiableRequestError):
            self.invalid_rows.add(row)

    @cached_property
    def sampled_rows(self) -> list[int]:
        """Rows that draw a token (not greedy), failed rows included."""
        return [i for i, r in enumerate(self.requests) if not r.sampling_params.greedy]

    @cached_property
    def wants_logprobs(self) -> bool:
        return any(r.sampling_params.logprobs is not None for r in self.requests)

    def tensor(self, values: list, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A per-row parameter as a tensor on the batch's device."""
        return torch.tensor(values, dtype=dtype, device=self.device)
