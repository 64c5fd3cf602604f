"""Launch-time facts shared by the attention launchers."""

from __future__ import annotations

import os

import torch
import triton

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
"""Whether the kernels run in Triton's CPU interpreter (read once, as triton itself does at ``@jit``)."""


def dot_precision(dtype: torch.dtype) -> str | None:
    """float32 inputs multiply in full precision (TF32 would miss the float32 tolerances);
    None leaves 16-bit inputs to the target's default."""
    return "ieee" if dtype == torch.float32 else None


def head_pad(head_dim: int) -> int:
    """The power-of-two register width of a head (80 -> 128); masks hide the padding."""
    return max(16, triton.next_power_of_2(head_dim))


def key_tile(head_dim: int, dtype: torch.dtype) -> int:
    """Keys per inner-loop step: wide heads in float32 take narrower tiles to fit in registers."""
    return 16 if head_dim > 128 and dtype == torch.float32 else 32


def cache_strides(cache: torch.Tensor) -> tuple[int, int, int, int]:
    """Strides of a ``[num_blocks, block_size, num_kv_heads, head_dim]`` K or V cache view."""
    if cache.dim() != 4:
        raise ValueError(f"a K or V cache must be [num_blocks, block_size, num_kv_heads, head_dim], got {cache.shape}")
    return tuple(cache.stride())
