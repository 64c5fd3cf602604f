"""The SamplingKernel interface: a platform's fused draw of one token per row over the whole vocabulary."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import torch


class SamplingKernel(ABC):
    """Temperature, min-p, the inverse-CDF draw and the top-p check of one row, as one call for the
    whole batch instead of the half-dozen full-vocabulary PyTorch ops each is otherwise (each op
    allocates and re-reads ``rows x vocab`` floats; a decode step's sampling is then a noticeable
    share of a small model's step).

    A platform offers one through :meth:`Platform.sampling_kernel`; the sampler calls it for the
    sampled rows without a top-k (see :mod:`kvserve.sampling.draw`, which owns the top-p rejection
    rounds and the sort for rows still unsettled after them). Core's
    ``kvserve.sampling.torch_kernel.TorchSamplingKernel`` is the reference; an implementation agrees
    with it up to float32 rounding (a different summation order may move a draw that lands within
    rounding of a boundary between two tokens). ``kvserve.testing``'s ``PlatformContract`` checks both.
    """

    name: ClassVar[str]
    """Short name for the start-up line (e.g. ``"torch"``, ``"cpu-native"``)."""

    def describe(self) -> str:
        """What the start-up line says about the kernel: the name, and where a platform fell back to
        core's, why."""
        return self.name

    @abstractmethod
    def draw(
        self,
        logits: torch.Tensor,
        temperature: torch.Tensor,
        min_p: torch.Tensor,
        top_p: torch.Tensor,
        uniform: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per row; every argument on ``logits``' device, none written.

        ``logits``: float32 ``[rows, vocab]``, rows contiguous, ``-inf`` for masked tokens (every row
        has at least one finite value). ``temperature``, ``min_p``, ``top_p``, ``uniform``: float32
        ``[rows]``; ``temperature > 0``, ``0 <= min_p <= 1``, ``0 < top_p <= 1``, ``0 <= uniform < 1``.

        For row ``i``: ``p = softmax(logits[i] / temperature[i])`` (possibly unnormalized, as long as
        it is proportional); tokens with ``p < min_p[i] * max(p)`` get ``p = 0``; ``total = sum(p)``.
        The token is the first column whose cumulative ``p`` (in token-id order) exceeds
        ``uniform[i] * total``; where rounding leaves none, the last column with ``p > 0``. Never a
        column with ``p == 0``.

        Returns ``(tokens, inside)``: int64 ``[rows]`` and bool ``[rows]``, ``inside[i]`` saying
        whether the token is in the row's top-p nucleus: the mass of the tokens strictly more likely
        than it is below ``top_p[i] * total`` (so always true where ``top_p[i] == 1``).
        """
