"""A service's CPU priority: its `nice` setting applied to every thread it has, once, at start.

On a host whose cores the services share, the traffic manager's copies and messages compete
with the engines' forward passes; a positive niceness lets a forward have the core first and
leaves the copies every cycle the engines do not use (niceness changes nothing on an idle
core). Linux keeps niceness per thread and a new thread inherits its creator's, so the
threads already running (an import may have started some) are set one by one, and every
thread started later inherits it from them.
"""
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
    """Raise this process's niceness by `n` (0..19, capped at 19) on every current thread; returns the
    main thread's niceness after. Lowering it needs privileges, so `n` is never negative."""
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
