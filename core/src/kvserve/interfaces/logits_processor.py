"""The LogitsProcessor interface: vLLM v1's batch-level logits processors, as a plugin kind.

A processor sees the whole batch's logits once per step and keeps its own per-row state, told of
every change to the batch's rows through :meth:`LogitsProcessor.update_state`. A processor written
for vLLM's interface ports by changing its imports; requests opt in through
``SamplingParams.extra_args``.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from kvserve.config import EngineConfig
    from kvserve.sampling_params import SamplingParams


class MoveDirectionality(enum.Enum):
    UNIDIRECTIONAL = enum.auto()
    """The request at the first index moves to the second; the first index is then empty."""
    SWAP = enum.auto()
    """The requests at the two indices trade places."""


RemovedRequest = int
"""The batch index of a request that left the batch."""
AddedRequest = tuple[int, "SamplingParams", "list[int] | None", "list[int]"]
"""``(index, params, prompt_token_ids, output_token_ids)`` of a request that joined the batch at
``index`` (replacing whatever was there). ``output_token_ids`` is the request's live list: it grows
as the request emits tokens, so a processor may keep a reference instead of copying."""
MovedRequest = tuple[int, int, MoveDirectionality]
"""``(from_index, to_index, directionality)``."""


@dataclass(frozen=True)
class BatchUpdate:
    """How the batch's rows changed since the last step. Apply in this order: ``removed``, then
    ``added``, then ``moved``; afterwards row ``i`` of the next ``apply`` is the request at index ``i``."""

    batch_size: int
    """Rows in the next ``apply``."""
    removed: Sequence[RemovedRequest]
    added: Sequence[AddedRequest]
    moved: Sequence[MovedRequest]


class LogitsProcessor(ABC):
    """Changes the batch's float32 logits ``[batch_size, vocab]`` each step, for the rows it tracks.

    Constructed once per engine, on the device the logits live on; runs in the sampler pipeline after
    the requests' own ``logits_processors`` and before allowed/bad tokens, bias and penalties.
    """

    @abstractmethod
    def __init__(self, config: EngineConfig, device: torch.device, is_pin_memory: bool) -> None:
        """``config``: the engine's; ``device``: where the logits are; ``is_pin_memory``: whether host
        tensors may be pinned for copies."""

    @classmethod  # noqa: B027 - optional: most processors accept any params
    def validate_params(cls, params: SamplingParams) -> None:
        """Raise ``ValueError`` naming the field (e.g. ``extra_args.target_token``) if ``params`` are
        invalid for this processor; called once per request before it is queued."""

    @abstractmethod
    def is_argmax_invariant(self) -> bool:
        """True if :meth:`apply` never changes any row's argmax: then it is skipped for batches where
        every row is greedy (its state is still updated)."""

    @abstractmethod
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Track the batch's rows; ``None`` when nothing changed since the last step. Called once per
        step before :meth:`apply`."""

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The processed logits, same shape (``logits`` changed in place is fine)."""
