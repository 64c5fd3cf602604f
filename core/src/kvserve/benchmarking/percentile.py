"""Linearly interpolated percentiles, as numpy's default, without numpy arrays for a few floats."""

from __future__ import annotations

import math


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile (0..100) of ``values``; NaN for none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
