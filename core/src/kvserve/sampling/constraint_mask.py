"""The mask stage fed by per-request constraint objects (grammars): first in the pipeline."""

from __future__ import annotations

import numpy as np
import torch

from kvserve.interfaces.logits_constraint import bitmask_words
from kvserve.request import Request
from kvserve.sampling.batch import SamplingBatch
from kvserve.sampling.stage import SamplerStage


def banned_tokens(bitmask: torch.Tensor, vocab_size: int, device: torch.device) -> torch.Tensor:
    """Host int32 ``[rows, words]`` bitmask -> bool ``[rows, vocab_size]`` on ``device``, True where a token
    is banned (its bit clear); bit ``j`` of word ``w`` is token ``32 * w + j``, as xgrammar and llguidance
    write them. The packed words cross to an accelerator (32x smaller than the unpacked mask)."""
    if device.type == "cpu":  # numpy's unpackbits: ~0.1 ms for 32 rows of a 49k vocabulary
        packed = np.invert(bitmask.numpy().view(np.uint8))  # little-endian host: byte order = bit order
        return torch.from_numpy(np.unpackbits(packed, axis=1, count=vocab_size, bitorder="little")).view(torch.bool)
    return unpack_on_device(bitmask.to(device, non_blocking=True), vocab_size)


def unpack_on_device(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``banned_tokens`` with torch's bit operations, where ``bitmask`` is (any device)."""
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size] == 0


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
        banned = banned_tokens(bitmask, logits.shape[1], logits.device)
        if len(rows) == len(batch.requests):  # every row constrained: in place, no gather
            return logits.masked_fill_(banned, float("-inf"))
        index = torch.tensor(rows, device=logits.device)
        logits[index] = logits[index].masked_fill(banned, float("-inf"))
        return logits

    def on_accept(self, request: Request, token_ids: list[int]) -> None:
        constraint = request.logits_constraint
        if constraint is not None and not constraint.accept_tokens(token_ids):
            raise ValueError(f"its constraint refused the tokens {token_ids}")
