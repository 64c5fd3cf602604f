"""Run a command and report how much CPU *other* processes used meanwhile, to tell a quiet run from a noisy one.

    python benchmarks/peers/runmon.py [--tree PID] -- CMD ...

``--tree PID`` counts that process and its descendants (e.g. a server the command talks to) as the run's own.
Prints ``[mon] wall=.. busy_cpu_s=.. own_cpu_s=.. foreign_cpu_s=..`` on stderr and exits with CMD's status.
"""

import os
import resource
import subprocess
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy (not idle, not waiting on I/O) since boot."""
    with open("/proc/stat") as f:
        ticks = list(map(int, f.readline().split()[1:]))
    return (sum(ticks) - ticks[3] - ticks[4]) / HZ


def _own_ticks(pid: int | str) -> tuple[int, list[str]]:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[1]), fields  # parent pid; utime, stime, cutime, cstime are fields[11:15]


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds used so far by ``root`` and its living descendants."""
    children: dict[int, list[list[str]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent, fields = _own_ticks(entry)
            except OSError:
                continue
            children.setdefault(parent, []).append([entry, *fields])
    total = 0.0
    try:
        total += sum(int(x) for x in _own_ticks(root)[1][11:15]) / HZ
    except OSError:
        pass
    todo = [root]
    while todo:
        for pid, *fields in children.get(todo.pop(), []):
            total += sum(int(x) for x in fields[11:15]) / HZ
            todo.append(int(pid))
    return total


def main(args: list[str]) -> int:
    tree = None
    if args[0] == "--tree":
        tree, args = int(args[1]), args[2:]
    if args[0] == "--":
        args = args[1:]
    usage0, busy0, start = resource.getrusage(resource.RUSAGE_CHILDREN), busy_cpu_seconds(), time.time()
    tree0 = tree_cpu_seconds(tree) if tree else 0.0
    status = subprocess.call(args)
    busy1, end, usage1 = busy_cpu_seconds(), time.time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    tree1 = tree_cpu_seconds(tree) if tree else 0.0
    own = (usage1.ru_utime + usage1.ru_stime - usage0.ru_utime - usage0.ru_stime) + (tree1 - tree0)
    busy = busy1 - busy0
    print(
        f"[mon] wall={end - start:.1f}s busy_cpu_s={busy:.1f} own_cpu_s={own:.1f} foreign_cpu_s={busy - own:.1f}",
        file=sys.stderr,
    )
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
