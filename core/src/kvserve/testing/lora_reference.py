"""The LoRA kernel check: a kernel's shrink and expand, and its add_lora_linear, against a dense
per-token float64 reference.

The platform contract runs it on each platform's kernel; a kernel package's own tests may run it
too, on whatever device and dtype its kernel can run there (a Triton kernel in the interpreter).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from kvserve.interfaces import LoRAKernel
from kvserve.lora.layers import plan_lora_batch


@dataclasses.dataclass(frozen=True)
class LoRACheck:
    """What :func:`check_lora_kernel` checked."""

    summary: str
    segment_lengths: list[int]
    """Tokens of each adapter segment, the empty ones included, ascending."""


def check_lora_kernel(
    kernel: LoRAKernel,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
    *,
    lengths: Sequence[int] = range(1, 10),
    rank: int = 8,
    in_features: int = 48,
    widths: Sequence[int] = (40, 16, 24),
) -> LoRACheck:
    """Segments of every length in ``lengths`` (adjacent ones of different slots too), base rows
    between them, empty segments, packed output slices of the ``widths``; against
    ``y + x A[slot] B[slot]`` per token in float64, base rows exactly as they were: shrink then
    expand, and add_lora_linear. Fails with an AssertionError naming the calls and the worst token;
    returns what it checked.

    The defaults are the platform contract's case; a kernel's own tests may widen it to reach its
    tiling (segments longer than a tile, ranks and features wider than a block)."""
    gen = torch.Generator().manual_seed(seed)
    num_slots, widths = 4, list(widths)
    runs = [(length, int(torch.randint(-1, num_slots, (1,), generator=gen))) for length in lengths]
    runs += [(1, slot) for slot in (0, 1, -1, 2, 2, 3)]  # decode rows: neighbours of other or equal slots
    order = torch.randperm(len(runs), generator=gen).tolist()
    slots = np.concatenate([np.full(runs[i][0], runs[i][1], np.int64) for i in order])
    batch = plan_lora_batch(slots, device)
    assert batch is not None
    # Empty segments must be skipped wherever they sit.
    segments = [(0, 0, 1), *batch.segments, (len(slots), len(slots), 3)]
    batch = dataclasses.replace(batch, segments=tuple(segments))
    x = torch.randn(len(slots), in_features, generator=gen)
    lora_a = torch.randn(num_slots, in_features, len(widths) * rank, generator=gen) / in_features**0.5
    lora_b = [torch.randn(num_slots, rank, width, generator=gen) / rank**0.5 for width in widths]
    y = torch.randn(len(slots), sum(widths), generator=gen)
    expected = y.double().clone()
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        h = x[t].double() @ lora_a[slot].double()
        pieces = [h[i * rank : (i + 1) * rank] @ b[slot].double() for i, b in enumerate(lora_b)]
        expected[t] += torch.cat(pieces)
    x_dev, a_dev = x.to(device, dtype), lora_a.to(device, dtype)
    b_dev = [b.to(device, dtype) for b in lora_b]
    y_dev, y_fused = y.to(device, dtype, copy=True), y.to(device, dtype, copy=True)
    h = kernel.shrink(x_dev, a_dev, batch)
    assert h.shape == (len(slots), len(widths) * rank), f"shrink returned shape {tuple(h.shape)}"
    kernel.expand(y_dev, h, b_dev, batch)
    kernel.add_lora_linear(y_fused, x_dev, a_dev, b_dev, batch)
    base = torch.from_numpy(slots < 0)
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    for calls, result in (("shrink + expand", y_dev), ("add_lora_linear", y_fused)):
        got = result.double().cpu()
        assert torch.equal(got[base], y.to(dtype).double()[base]), f"{calls} changed rows of base-model tokens"
        error = (got - expected).abs().amax(dim=1)
        worst = int(error.argmax())
        assert float(error[worst]) <= tolerance * (1 + float(expected[worst].abs().max())), (
            f"{calls}: token {worst} (slot {int(slots[worst])}, in a segment of "
            f"{next(stop - start for start, stop, _ in segments if start <= worst < stop)} tokens) is off the dense "
            f"reference by {float(error[worst]):.3g}"
        )
    return LoRACheck(
        f"{kernel.name} LoRA kernel on {device} in {dtype}: {len(slots)} tokens ({int(base.sum())} base), "
        f"{len(segments)} segments, {num_slots} slots, slices {widths} of rank {rank}; "
        f"worst error {float(error[worst]):.2g}",
        sorted(stop - start for start, stop, _ in segments),
    )
