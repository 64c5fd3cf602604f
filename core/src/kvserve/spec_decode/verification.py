"""Verifying drafts exactly: what the sampler sees of each verification row, and what is accepted.

A chunk with ``k`` drafts has ``k + 1`` logits rows; row ``j`` is the target model's distribution
after the request's tokens and drafts ``0 .. j-1``. Each row is sampled by the ordinary sampler
pipeline as the request would be with those drafts already emitted (:func:`row_requests`: penalties,
``min_tokens``, bad words and logits processors see them; a grammar is advanced through them), and
the drafts are accepted while each equals the token sampled at its position (:func:`accepted_tokens`);
the first token that differs (the recovery), or the one after all drafts (the bonus), is emitted too.

This is the rejection rule of Leviathan et al. / Chen et al. (vLLM's ``RejectionSampler``) for
drafts proposed with certainty: draft ``d`` is kept with probability ``p(d)`` (the chance the target
samples it), and on rejection the emitted token follows ``p`` with ``d`` left out, renormalized —
exactly the residual ``max(0, p - q)`` for a point mass ``q`` at ``d``. Every emitted token is thus
drawn from the target's distribution given the tokens before it, so sampled requests keep it exactly
and greedy requests emit the argmax, token for token as without speculation. A seeded request's
draw at each output position comes from a generator of its seed and that position only
(:class:`~kvserve.sampling.noise.NoiseSource`), so its output does not change with speculation either.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence

import torch

from kvserve.interfaces.logits_constraint import LogitsConstraint, bitmask_words
from kvserve.request import Request

logger = logging.getLogger("kvserve")


def can_verify_constraint(constraint: LogitsConstraint | None) -> bool:
    """Whether a request with ``constraint`` may carry drafts: none, or one that can roll back."""
    return constraint is None or type(constraint).rollback is not LogitsConstraint.rollback


def row_requests(request: Request, drafts: Sequence[int], vocab_size: int) -> list[Request]:
    """What the sampler sees for ``request``'s ``len(drafts) + 1`` verification rows: row 0 is the
    request itself; row ``j`` a copy whose output ends with ``drafts[:j]`` (and whose grammar mask is
    the one after them). Only the copies' lists and constraint differ; the request is left as it was."""
    rows = [request]
    masks = None
    if request.logits_constraint is not None:
        try:
            masks = _draft_masks(request.logits_constraint, drafts, vocab_size)
        except Exception as exc:  # the constraint's own code: its rows past 0 ban every token, failing
            # the request if one of them is reached (row 0 is filled by the mask stage as without drafts)
            logger.warning("request %s: its grammar failed on its drafts: %r", request.request_id, exc)
            masks = torch.zeros((len(drafts) + 1, bitmask_words(vocab_size)), dtype=torch.int32)
    for j in range(1, len(drafts) + 1):
        row = copy.copy(request)
        row.output_token_ids = [*request.output_token_ids, *drafts[:j]]
        row.draft_token_ids = []
        if masks is not None:
            row.logits_constraint = _FixedMask(masks[j])
        rows.append(row)
    return rows


def accepted_tokens(drafts: Sequence[int], sampled: Sequence[int]) -> list[int]:
    """The drafts kept and the token after them, given ``sampled[j]``, the token sampled at row ``j``
    (``len(drafts) + 1`` of them): drafts while they equal what was sampled, then the first sampled
    token that differs, or the bonus ``sampled[-1]`` when all matched."""
    for j, draft in enumerate(drafts):
        if sampled[j] != draft:
            return [*drafts[:j], sampled[j]]
    return [*drafts, sampled[len(drafts)]]


def _draft_masks(constraint: LogitsConstraint, drafts: Sequence[int], vocab_size: int) -> torch.Tensor:
    """The constraint's bitmask at each row: filled, then advanced by each draft, then rolled back to
    where it was. Rows after a draft the constraint refuses repeat the last mask: that draft is then
    banned in its own row, so it is never accepted and those rows are never used. Rows after a draft
    that ends the grammar (its EOS) repeat it too: the request stops at that token."""
    masks = torch.full((len(drafts) + 1, bitmask_words(vocab_size)), -1, dtype=torch.int32)
    constraint.fill_bitmask(masks, 0)
    advanced = 0
    try:
        for j, draft in enumerate(drafts, start=1):
            if not constraint.accept_tokens([draft]):
                masks[j:] = masks[j - 1]
                break
            advanced += 1
            if constraint.is_terminated():
                masks[j:] = masks[j - 1]
                break
            constraint.fill_bitmask(masks, j)
    finally:
        if advanced:
            constraint.rollback(advanced)
    return masks


class _FixedMask(LogitsConstraint):
    """A verification row's grammar mask, computed before the sampler runs; only ever filled."""

    def __init__(self, mask: torch.Tensor) -> None:
        self.mask = mask

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Copies the precomputed row."""
        bitmask[row] = self.mask

    def accept_tokens(self, token_ids: list[int]) -> bool:
        """Never called: tokens are accepted by the request's own constraint."""
        raise RuntimeError("a verification row's mask accepts no tokens")

    def is_terminated(self) -> bool:
        """Never asked: the request's own constraint decides."""
        return False
