"""The token embedding matrix, also used as a (tied) LM head."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class VocabEmbedding(torch.nn.Module):
    """A ``[vocab, hidden]`` matrix used as token embedding and/or as the LM head."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        # Left uninitialised: weight loading fills it, and random init of a large vocab is slow.
        self.weight = torch.nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Embedding rows of ``input_ids``."""
        return F.embedding(input_ids, self.weight)
