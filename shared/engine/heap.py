"""Keep freed tensor memory in the engine's heap instead of handing it back to the kernel.

Owns one knob of the C allocator (glibc `mallopt`), set once when an engine starts.
Why: every model step allocates temporaries of a few MB (a decode step's gathered K/V,
attention scores, activations). glibc serves an allocation above its mmap threshold
with a fresh `mmap` and gives it back with `munmap` on free, so the next step touches
new pages and takes one page fault per 4 KiB. On SmolLM2 that was most of a decode
step's gather (batch 16: 216 of 373 ms). With the threshold raised, freed chunks stay
in the heap and the next step reuses pages that are already mapped, which is what the
caching allocators of GPU engines do for device memory.

Example: `keep_freed(1024)` -> mmap threshold 1 GiB, trim threshold 2 GiB: chunks
below 1 GiB come from the heap, and free memory at the heap's top is returned to the
kernel only past 2 GiB. `keep_freed(0)` changes nothing (glibc's own defaults).
Elsewhere than glibc (musl, macOS) `mallopt` is absent and this is a no-op that says so.
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
