"""Keep freed tensor memory in the engine's heap rather than returning it to the kernel.

glibc's mmap threshold is raised, so each step reuses mapped pages (no-op without glibc).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("engine.heap")

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MIB = 1 << 20


def plan(keep_mb: int) -> dict[int, int]:
    """The mallopt settings for `keep_mb` (pure): {param: value}; empty = leave glibc's."""
    if keep_mb < 0:
        raise ValueError(f"heap keep must be >= 0 MB, got {keep_mb}")
    if not keep_mb:
        return {}
    return {M_MMAP_THRESHOLD: keep_mb * MIB, M_TRIM_THRESHOLD: 2 * keep_mb * MIB}


def keep_freed(keep_mb: int) -> bool:
    """Apply `plan(keep_mb)` to this process; True when every setting took."""
    settings = plan(keep_mb)
    if not settings:
        return False
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        log.info("heap: no glibc mallopt here (%s); freed memory goes back to the kernel", name)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = all(mallopt(param, min(value, 2**31 - 1)) == 1 for param, value in settings.items())
    log.info("heap: freed chunks below %d MB stay in the process (mallopt %s)", keep_mb, "ok" if ok else "refused")
    return ok
