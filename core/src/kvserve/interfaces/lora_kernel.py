"""The LoRAKernel interface: a platform's batched shrink and expand of many LoRA adapters in one step."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class LoRABatch:
    """Which adapter slot each token of a forward uses, grouped once per step on the host and shared
    by every LoRA layer of the forward.

    Token ``t``'s slot is ``token_slots[t]`` (``-1``: the base model, no adapter). ``segments`` lists
    ``(start, stop, slot)``: tokens ``start:stop`` all use ``slot >= 0``; segments are ascending and
    disjoint and cover every adapter token, and no base token; one may be empty (``start == stop``).
    A prefill chunk is a long segment, a decode row a one-token segment (SGMV serves the former,
    BGMV the latter). ``single_rows`` / ``single_slots`` (int64 ``[n]``, on the device) repeat the
    one-token segments as tensors, for a kernel that gathers them into one batched call.
    """

    num_tokens: int
    token_slots: torch.Tensor
    """int64 ``[num_tokens]`` on the device."""
    segments: tuple[tuple[int, int, int], ...]
    single_rows: torch.Tensor
    single_slots: torch.Tensor


class LoRAKernel(ABC):
    """``y += scale · (x A_i) B_i`` for each token's adapter ``i``: :meth:`shrink` (``h = x A``, down
    to the rank) then :meth:`expand` (``y += h B``, per output slice of a packed layer), which a layer
    runs as one :meth:`add_lora_linear` (a kernel may fuse the two there). The scale is folded into
    ``B`` when an adapter is loaded.

    Adapters live in slots: ``lora_a`` is ``[slots, in, R]`` and each ``lora_b`` ``[slots, R, out]``,
    one slot per adapter (``R`` the largest rank, a smaller rank zero-padded). Tokens of the base
    model (slot ``-1``) are neither read nor written: a step without adapters costs nothing more.

    A platform offers one through :meth:`Platform.lora_kernel`; core's
    ``kvserve.lora.torch_kernel.TorchLoRAKernel`` (SGMV for segments, BGMV for one-token ones, in
    PyTorch) is the reference. An implementation agrees with a dense per-token reference up to the
    dtype's rounding; ``kvserve.testing``'s ``PlatformContract`` checks it.
    """

    name: ClassVar[str]
    """Short name for the start-up line (e.g. ``"torch"``)."""

    @abstractmethod
    def shrink(self, x: torch.Tensor, lora_a: torch.Tensor, batch: LoRABatch) -> torch.Tensor:
        """``h[t] = x[t] @ lora_a[slot(t)]`` for every adapter token ``t``.

        ``x``: ``[num_tokens, in]``; ``lora_a``: ``[slots, in, R]``, both of the model dtype on the
        device, not written. Returns ``h``, ``[num_tokens, R]`` of ``x``'s dtype; its rows of base
        tokens are unspecified (:meth:`expand` never reads them).
        """

    @abstractmethod
    def expand(self, y: torch.Tensor, h: torch.Tensor, lora_b: Sequence[torch.Tensor], batch: LoRABatch) -> None:
        """In place, for every adapter token ``t`` and slice ``s``:
        ``y[t, o_s : o_s + out_s] += h[t, s·r : (s+1)·r] @ lora_b[s][slot(t)]``.

        ``y``: ``[num_tokens, sum(out_s)]``, the base layer's output; ``h``: ``[num_tokens, len(lora_b)·r]``
        (:meth:`shrink` of the slices' ``A`` side by side); ``lora_b[s]``: ``[slots, r, out_s]``, its
        slice's output features starting at ``o_s = out_0 + ... + out_{s-1}``. Rows of base tokens of
        ``y`` are left exactly as they were.
        """

    def add_lora_linear(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a: torch.Tensor,
        lora_b: Sequence[torch.Tensor],
        batch: LoRABatch,
        prefetch: Sequence[torch.Tensor] = (),
    ) -> None:
        """In place, ``expand(y, shrink(x, lora_a, batch), lora_b, batch)``: what a LoRA layer calls
        once per forward, with the operands of :meth:`shrink` and :meth:`expand`.

        This default makes the two calls; a kernel overrides it to run both in one pass (``h`` kept
        in cache between them, one launch or thread-pool wake instead of two). The result is that
        of the two calls, ``h`` rounded to ``x``'s dtype in between; rows of base tokens of ``y`` are
        left exactly as they were.

        ``prefetch``: the next LoRA layer's ``lora_a`` and ``lora_b`` tensors (same slots), a hint a
        kernel may use to start bringing the batch's slots of them into cache once this call's work
        is done; it never changes a result, and this default ignores it.
        """
        self.expand(y, self.shrink(x, lora_a, batch), lora_b, batch)
