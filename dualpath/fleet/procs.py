"""The fleet run's processes as /proc sees them: CPU seconds and CPU affinity.

Reads and sets; starts nothing.
"""
from __future__ import annotations

import os


def cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds (0.0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def children_cpu_s(pid: int) -> float:
    """CPU of a process's live children (the scheduler's front-door workers)."""
    return sum(cpu_s(c) for c in children(pid))


def set_affinity(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` onto `cpus` (threads it starts later inherit its own)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (OSError, ValueError):
            pass  # a thread that ended meanwhile


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(c) for c in fh.read().split()]
    except (OSError, ValueError):
        return []
