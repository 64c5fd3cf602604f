"""Timing variants in alternating rounds, so that a shared machine's slow spells fall on each alike."""

from __future__ import annotations

import time
from collections.abc import Callable


def alternate(variants: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Seconds of each variant per round, the order flipping every round."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds):
        for name in list(variants)[:: 1 if r % 2 == 0 else -1]:
            start = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - start)
    return times
