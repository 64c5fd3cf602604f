"""The token embedding matrix, also used as a (tied) LM head."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from kvserve.interfaces.linear_kernel import LinearKernel


class VocabEmbedding(torch.nn.Module):
    """A ``[vocab, hidden]`` matrix used as token embedding and/or as the LM head."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        # Left uninitialised: weight loading fills it, and random init of a large vocab is slow.
        self.weight = torch.nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)
        self.head_kernel: LinearKernel | None = None
        self.packed_head: torch.Tensor | None = None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Embedding rows of ``input_ids``."""
        return F.embedding(input_ids, self.weight)

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head: ``hidden @ weight.T`` (in ``hidden``'s dtype) for ``hidden [n, hidden_size]``."""
        if self.head_kernel is None:
            return F.linear(hidden, self.weight)
        return self.head_kernel.apply(hidden, self.packed_head, None)

    def pack_head(self, kernel: LinearKernel, keep_embedding: bool) -> bool:
        """Compute :meth:`project` with ``kernel`` on a packed copy of the weight, where
        ``kernel.pack`` takes it; returns whether it did.

        Without ``keep_embedding`` (an untied LM head, never asked to embed) the dense weight is
        freed and :meth:`forward` can no longer run.
        """
        packed = kernel.pack(self.weight.data)
        if packed is None:
            return False
        self.head_kernel, self.packed_head = kernel, packed
        if not keep_embedding:
            self.weight = torch.nn.Parameter(self.weight.data.new_empty(0), requires_grad=False)
        return True
