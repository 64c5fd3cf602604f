"""The SamplerStage base: one named, batched step of the sampler pipeline."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from kvserve.request import Request
from kvserve.sampling.batch import SamplingBatch


class SamplerStage(ABC):
    """Changes a batch's float32 logits ``[rows, vocab]`` before the draw.

    The pipeline calls :meth:`apply` only when :meth:`wants` says the stage alters some row this step,
    and only after copying the caller's logits, so a stage may write in place. A failure that belongs
    to one row is recorded with :meth:`SamplingBatch.fail`; the other rows go on.
    """

    name: str

    @abstractmethod
    def wants(self, batch: SamplingBatch) -> bool:
        """Whether any row of ``batch`` is changed by this stage (cheap: it runs every step)."""

    @abstractmethod
    def apply(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """The processed logits, same shape and device (``logits`` itself, changed in place, is fine)."""

    def on_accept(self, request: Request, token_ids: list[int]) -> None:  # noqa: B027 - most stages keep no state
        """``request`` emitted ``token_ids`` (after the stop rules): advance per-request state. Raising
        fails that request."""

    def forget(self, request_id: str) -> None:  # noqa: B027 - most stages keep no state
        """``request_id`` finished: drop what is kept for it."""
