"""The LogitsConstraint interface: a stateful, per-request restriction on the next token.

A grammar matcher (structured outputs) is the typical one: the sampler's mask stage asks every
constrained row for the tokens allowed next, and once the step's tokens are accepted it tells the
constraint, so its state advances with what the request really emitted.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def bitmask_words(vocab_size: int) -> int:
    """int32 words a bitmask row needs for ``vocab_size`` tokens (32 tokens a word)."""
    return -(-vocab_size // 32)


class LogitsConstraint(ABC):
    """What one request may emit next, advanced token by token.

    The bitmask format is the one xgrammar and llguidance fill: an int32 tensor
    ``[rows, bitmask_words(vocab)]`` on the host, where bit ``j`` of word ``w`` of a row set means token
    ``32 * w + j`` is allowed. Bits past the vocabulary are ignored.
    """

    @abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed at this request's next position into ``bitmask[row]`` (every word of
        the row; the row holds garbage before). Raising fails this request alone."""

    @abstractmethod
    def accept_tokens(self, token_ids: list[int]) -> bool:
        """Advance past ``token_ids``, the tokens the request just emitted, in order. False if one was
        not allowed (the request is then failed)."""

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (speculative decoding rejects drafts)."""
        raise NotImplementedError(f"{type(self).__name__} cannot roll back")

    @abstractmethod
    def is_terminated(self) -> bool:
        """True once nothing more may follow (the grammar reached its end); the request then stops."""

    def reset(self) -> None:
        """Back to the state before any token was accepted (a preempted request starts over)."""
        raise NotImplementedError(f"{type(self).__name__} cannot reset")
