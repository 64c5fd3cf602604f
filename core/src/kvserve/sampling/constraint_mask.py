"""The mask stage fed by per-request constraint objects (grammars): first in the pipeline."""

from __future__ import annotations

import torch

from kvserve.interfaces.logits_constraint import bitmask_words
from kvserve.request import Request
from kvserve.sampling.batch import SamplingBatch
from kvserve.sampling.stage import SamplerStage


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 ``[rows, words]`` bitmask -> bool ``[rows, vocab_size]``, True where a token is allowed."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.flatten(1)[:, :vocab_size].bool()


class ConstraintMaskStage(SamplerStage):
    """Rows whose request has a :class:`~kvserve.interfaces.LogitsConstraint` keep only the tokens it
    allows: every constrained row fills one row of one host bitmask, applied in one masked fill."""

    name = "constraint_mask"

    def wants(self, batch: SamplingBatch) -> bool:
        return any(r.logits_constraint is not None for r in batch.requests)

    def apply(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        rows = [i for i, r in enumerate(batch.requests) if r.logits_constraint is not None]
        bitmask = torch.full((len(rows), bitmask_words(logits.shape[1])), -1, dtype=torch.int32)
        for slot, row in enumerate(rows):
            try:
                batch.requests[row].logits_constraint.fill_bitmask(bitmask, slot)
            except Exception as exc:  # the constraint's own code or state: fail its request only
                batch.fail(row, "filling the constraint's token mask", exc)
        allowed = unpack_bitmask(bitmask, logits.shape[1])  # on the host, as the bitmask: no device sync
        for slot in (~allowed.any(dim=1)).nonzero().flatten().tolist():
            batch.fail(rows[slot], "applying its constraint", ValueError("the grammar allows no token here"))
        allowed = allowed.to(logits.device)
        index = torch.tensor(rows, device=logits.device)
        logits[index] = logits[index].masked_fill(~allowed, float("-inf"))
        return logits

    def on_accept(self, request: Request, token_ids: list[int]) -> None:
        constraint = request.logits_constraint
        if constraint is not None and not constraint.accept_tokens(token_ids):
            raise ValueError(f"its constraint refused the tokens {token_ids}")
