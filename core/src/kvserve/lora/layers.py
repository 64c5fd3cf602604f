"""LoRA slots beside a linear layer: ``y = base(x) + scale · (x A_i) B_i`` per token's adapter ``i``.

The step input carries each token's adapter slot under :data:`LORA_SLOT` (``-1``: the base model)
and the adapters to put into slots before it runs (:class:`SlotLoad`, decided by the host's
:class:`~kvserve.lora.manager.LoRAManager`); :class:`LoRASlots`, the runner's (every rank's), fills
its rank's shard of each layer's slots from them. :class:`LoRAStep` turns the per-token slots into
one :class:`~kvserve.interfaces.lora_kernel.LoRABatch` per forward, which every :class:`LoRALinear`
of the model shares.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from kvserve.forward_context import ForwardContext, get_forward_context
from kvserve.interfaces.lora_kernel import LoRABatch, LoRAKernel
from kvserve.layers.embedding import projection_layers
from kvserve.layers.linear import LinearBase

LORA_SLOT = "lora_slot"
"""The per-token metadata name of each token's adapter slot."""


def plan_lora_batch(slots: np.ndarray, device: torch.device) -> LoRABatch | None:
    """The batch of the per-token ``slots`` (int64 ``[num_tokens]``, ``-1`` for base tokens): every
    maximal run of one slot is a segment. None when no token uses an adapter (nothing to add)."""
    if not (slots >= 0).any():
        return None
    edges = np.flatnonzero(np.diff(slots)) + 1
    starts = np.concatenate(([0], edges))
    stops = np.concatenate((edges, [len(slots)]))
    segments = tuple(
        (int(start), int(stop), int(slots[start])) for start, stop in zip(starts, stops) if slots[start] >= 0
    )
    single = [start for start, stop, _ in segments if stop - start == 1]
    return LoRABatch(
        num_tokens=len(slots),
        token_slots=torch.from_numpy(slots).to(device),
        segments=segments,
        single_rows=torch.tensor(single, dtype=torch.int64, device=device),
        single_slots=torch.tensor([int(slots[row]) for row in single], dtype=torch.int64, device=device),
    )


class LoRAStep:
    """The kernel and the running forward's :class:`LoRABatch`, planned at the first LoRA layer
    of each forward and reused by the others."""

    def __init__(self, kernel: LoRAKernel, device: torch.device) -> None:
        self.kernel = kernel
        self.device = device
        self._context: ForwardContext | None = None
        self._batch: LoRABatch | None = None

    def batch(self) -> LoRABatch | None:
        """This forward's batch; None when no token uses an adapter (or the forward carries no slots)."""
        context = get_forward_context()
        if context is not self._context:  # the runner builds a context per forward
            self._context = context
            slots = context.token_metadata.get(LORA_SLOT)
            self._batch = None if slots is None else plan_lora_batch(slots.cpu().numpy(), self.device)
        return self._batch


class LoRALinear(torch.nn.Module):
    """``max_loras`` adapter slots of one linear layer with ``len(output_sizes)`` slices (q/k/v of a
    fused projection, or one).

    ``lora_a`` is ``[slots, in, slices · max_rank]`` (the slices' ``A`` side by side, so one shrink
    serves all), ``lora_b[s]`` is ``[slots, max_rank, output_sizes[s]]`` with the adapter's scale
    folded in. A slot an adapter leaves a slice of (or all of) is zero there.
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        max_loras: int,
        max_rank: int,
        step: LoRAStep,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.step = step
        self.max_rank = max_rank
        device = step.device
        self.register_buffer(
            "lora_a", torch.zeros(max_loras, input_size, len(output_sizes) * max_rank, dtype=dtype, device=device)
        )
        self.lora_b = [torch.zeros(max_loras, max_rank, size, dtype=dtype, device=device) for size in output_sizes]
        for index, b in enumerate(self.lora_b):
            self.register_buffer(f"lora_b_{index}", b)
        self.prefetch: tuple[torch.Tensor, ...] = ()
        """The next LoRA layer's ``lora_a`` and ``lora_b`` in forward order (set by :class:`LoRASlots`),
        which the kernel may bring into cache after this layer's term (a hint, see
        :meth:`~kvserve.interfaces.lora_kernel.LoRAKernel.add_lora_linear`)."""

    def set_slot(self, slot: int, slices: list[tuple[torch.Tensor, torch.Tensor] | None]) -> None:
        """Put an adapter in ``slot``: per slice its ``(A [r, in], B [out, r])`` as PEFT saves them,
        the scale already in ``B``, or None where the adapter does not touch the slice."""
        self.lora_a[slot].zero_()
        for index, weights in enumerate(slices):
            self.lora_b[index][slot].zero_()
            if weights is None:
                continue
            a, b = weights
            rank, first = a.shape[0], index * self.max_rank
            self.lora_a[slot, :, first : first + rank].copy_(a.t())
            self.lora_b[index][slot, :rank].copy_(b.t())

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``y`` (the base layer's output for ``x``) plus each adapter token's LoRA term, in place."""
        batch = self.step.batch()
        if batch is None:
            return y
        self.step.kernel.add_lora_linear(
            y.view(-1, y.shape[-1]), x.reshape(-1, x.shape[-1]), self.lora_a, self.lora_b, batch, self.prefetch
        )
        return y


@dataclass(frozen=True)
class SlotLoad:
    """An adapter to put into ``slot`` before a step runs: the host decides it once and the step
    carries it to every rank, so every rank's slots hold the same adapters."""

    slot: int
    modules: Mapping[str, tuple[torch.Tensor, torch.Tensor]]
    """Checkpoint module name -> ``(A [r, in], B [out, r])``, unsharded, the scale folded into ``B``
    (:attr:`~kvserve.lora.peft_adapter.LoRAAdapter.modules`)."""


class LoRASlots:
    """``max_loras`` slots beside every linear layer of ``model`` (this rank's shard of it), sharded
    as the layer is: a column-parallel layer's slots hold all of ``A`` and this rank's output
    features of ``B``, a row-parallel one's this rank's input features of ``A`` and all of ``B``
    (``RowLinear`` adds the term before its all-reduce)."""

    def __init__(self, model: torch.nn.Module, kernel: LoRAKernel, max_loras: int, max_rank: int) -> None:
        self.step = LoRAStep(kernel, next(model.parameters()).device)
        self.layers: list[tuple[LinearBase, LoRALinear]] = []
        self.targets: dict[str, tuple[int, int]] = {}
        """Checkpoint module name -> (input, output features) of the whole (unsharded, unpacked) layer:
        what an adapter's shapes are checked against."""
        for module in projection_layers(model):
            lora = LoRALinear(
                module.input_size, module.output_sizes, max_loras, max_rank, self.step, module.params_dtype
            )
            module.lora = lora
            self.layers.append((module, lora))
            for name, size in zip(module.shard_prefixes, module.full_output_sizes):
                self.targets[name] = (module.full_input_size, size)
        # Modules are registered in the order the forward runs them: each layer's next is the next one.
        for (_, lora), (_, following) in zip(self.layers, self.layers[1:]):
            lora.prefetch = (following.lora_a, *following.lora_b)

    def load(self, loads: Iterable[SlotLoad]) -> None:
        """Put each adapter of ``loads`` into its slot, this rank's part of every layer's."""
        for load in loads:
            for module, lora in self.layers:
                lora.set_slot(
                    load.slot,
                    [_rank_part(module, i, load.modules.get(name)) for i, name in enumerate(module.shard_prefixes)],
                )


def _rank_part(
    module: LinearBase, shard: int, weights: tuple[torch.Tensor, torch.Tensor] | None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """This rank's ``(A, B)`` of shard ``shard`` of ``module``: cut as its weight is."""
    if weights is None:
        return None
    a, b = weights
    if module.input_slice is not None:
        start, size = module.input_slice
        a = a[:, start : start + size]
    if module.shard_slices is not None:
        start, size = module.shard_slices[shard]
        b = b[start : start + size]
    return a, b
