"""Peak resident memory of a piece of work on the host, from the kernel's own high-water mark."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import psutil

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int | None:
    try:
        match = re.search(rf"^{field}:\s+(\d+) kB", STATUS.read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) if match else None


def _reset_high_water_mark() -> bool:
    """Linux resets VmHWM to the current RSS when "5" is written to clear_refs (since 4.0)."""
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def peak_rss_delta(fn: Callable[[], object]) -> int:
    """Run ``fn``; bytes its peak resident set rose above the resident set before it.

    Where the high-water mark cannot be reset (not Linux, no permission) this is the resident
    set's growth from before to after ``fn``: memory freed inside ``fn`` goes unseen there.
    """
    before = psutil.Process().memory_info().rss
    if _reset_high_water_mark():
        fn()
        peak_kib = _status_kib("VmHWM")
        if peak_kib is not None:
            return max(peak_kib * 1024 - before, 0)
    else:
        fn()
    return max(psutil.Process().memory_info().rss - before, 0)
