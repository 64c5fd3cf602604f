"""Launch facts the shrink and expand kernels share."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
"""Whether the kernels run in Triton's CPU interpreter (read once, as triton itself does at ``@jit``)."""

SEGMENT_TILE = 32
"""Tokens of one segment a program takes (SGMV): a prefill chunk is cut into tiles of this many."""


@triton.jit
def dot(a, b, DOT_FP32: tl.constexpr):
    """``a @ b`` accumulated in float32. ``DOT_FP32``: both cast to float32 and multiplied in full
    precision (float32 inputs, whose tolerance TF32 would miss, and the interpreter, whose 16-bit
    ``tl.dot`` is wrong); otherwise 16-bit inputs go to the tensor cores as they are."""
    if DOT_FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


def dot_fp32(dtype: torch.dtype) -> bool:
    return INTERPRETED or dtype == torch.float32


def block(size: int, widest: int) -> int:
    """The power-of-two tile over ``size`` features: at least 16 (``tl.dot``'s smallest), at most
    ``widest``; the interpreter pays per operation, not per element, so it takes the widest."""
    return max(16, min(widest, triton.next_power_of_2(size)))
