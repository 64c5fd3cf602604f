"""Core's :class:`SamplingKernel` in PyTorch ops: the reference, and the kernel of every device whose
platform has none of its own."""

from __future__ import annotations

from typing import ClassVar

import torch

from kvserve.interfaces.sampling_kernel import SamplingKernel


class TorchSamplingKernel(SamplingKernel):
    """A softmax, a cumsum and a binary search per row; the nucleus check is one more pass."""

    name: ClassVar[str] = "torch"

    def __init__(self, reason: str | None = None) -> None:
        """``reason``: why a platform fell back to this kernel, for the start-up line."""
        self.reason = reason

    def describe(self) -> str:
        return f"{self.name} ({self.reason})" if self.reason else self.name

    def draw(
        self,
        logits: torch.Tensor,
        temperature: torch.Tensor,
        min_p: torch.Tensor,
        top_p: torch.Tensor,
        uniform: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        probs = min_p_probs(logits, temperature, min_p)
        cdf = probs.cumsum(dim=-1)
        tokens = search_cdf(probs, cdf, uniform)
        if bool((top_p >= 1).all()):
            return tokens, torch.ones_like(tokens, dtype=torch.bool)
        chosen = probs.gather(1, tokens.unsqueeze(1))
        above = probs.where(probs > chosen, 0.0).sum(dim=-1)
        return tokens, (above < top_p * cdf[:, -1]) | (top_p >= 1)


def min_p_probs(logits: torch.Tensor, temperature: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """``softmax(logits / temperature)`` per row, with the tokens below ``min_p`` times the row's most
    likely token's probability zeroed (the rows then sum to less than one)."""
    probs = (logits / temperature.unsqueeze(1)).softmax(dim=-1)
    if bool((min_p > 0).any()):
        probs = probs.masked_fill(probs < probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1), 0.0)
    return probs


def search_cdf(probs: torch.Tensor, cdf: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The first column whose ``cdf`` (``probs.cumsum(-1)``, unnormalized) exceeds ``uniform * total``:
    a column with non-zero probability, since the cdf only rises on those. A draw that rounds up to
    the total takes the last such column."""
    target = (uniform * cdf[:, -1]).unsqueeze(1)
    columns = torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_max_(cdf.shape[1] - 1)
    empty = probs.gather(1, columns.unsqueeze(1)).squeeze(1) == 0
    if empty.any():
        last = probs.shape[1] - 1 - (probs.flip(1) > 0).int().argmax(dim=-1)
        columns = torch.where(empty, last, columns)
    return columns
