"""A service's CPU priority: its `nice` setting applied to every thread it has, once, at start."""
from __future__ import annotations

import logging
import os

log = logging.getLogger("priority")
MAX_NICE = 19  # the kernel's lowest priority


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # no procfs: the calling thread only
        return [0]


def add_niceness(n: int) -> int:
    """Raise niceness by `n` (capped at 19) on every current thread; returns the main thread's after."""
    if n < 0 or n > MAX_NICE:
        raise ValueError(f"nice {n!r}: must be 0..{MAX_NICE}")
    if n == 0:
        return os.getpriority(os.PRIO_PROCESS, 0)
    for tid in _threads():
        try:
            now = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, min(MAX_NICE, now + n))
        except (ProcessLookupError, PermissionError) as exc:  # a thread that just ended; a locked-down host
            log.debug("niceness of thread %s not changed: %s", tid, exc)
    return os.getpriority(os.PRIO_PROCESS, 0)
