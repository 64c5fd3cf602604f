"""What a runner's forward hands back to the engine: logits rows of the step's sample positions."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass(frozen=True, eq=False)
class StepLogits:
    """Row ``r`` of :attr:`logits` is the step input's sample position ``sample_indices[r]``;
    chunk ``i`` (``plan.scheduled[i]``) owns rows :meth:`rows` ``(i)``."""

    logits: torch.Tensor
    """float32 ``[num_samples, vocab]``, on the runner's device (on the CPU from a tensor-parallel worker)."""
    sample_start_loc: np.ndarray
    """``[num_chunks + 1]`` int64, as in the step input: chunk ``i``'s rows are ``sample_start_loc[i] ..
    sample_start_loc[i + 1] - 1``."""
    prompt_logits: dict[int, torch.Tensor] = field(default_factory=dict)
    """Chunk -> float32 ``[n, vocab]`` logits of the step input's ``prompt_logit_spans[chunk]`` tokens."""
    hidden_states: torch.Tensor | None = None
    """``[num_samples, hidden]`` in the model dtype, row for row with :attr:`logits`: the model's final
    hidden states (what its logits are computed from), when the step input's ``keep_hidden_states``
    asked for them; else None."""

    def rows(self, chunk: int) -> range:
        """Chunk ``chunk``'s rows of :attr:`logits`, in the order of its sample positions."""
        return range(int(self.sample_start_loc[chunk]), int(self.sample_start_loc[chunk + 1]))

    @property
    def sampled_chunks(self) -> list[int]:
        """The chunks with at least one row, ascending."""
        return np.flatnonzero(np.diff(self.sample_start_loc)).tolist()

    def to(self, device: str | torch.device) -> StepLogits:
        """The same rows with every tensor on ``device``."""
        prompt = {chunk: t.to(device) for chunk, t in self.prompt_logits.items()}
        hidden = None if self.hidden_states is None else self.hidden_states.to(device)
        return StepLogits(self.logits.to(device), self.sample_start_loc, prompt, hidden)
