"""Collections at a steady pace, so a service in steady state never pauses long for one.

Owns when a long-running service's cyclic garbage collector runs. CPython starts a
collection when allocations of tracked objects outnumber their deallocations by the first
threshold (700). A service in steady state, with requests arriving and finishing at one rate,
frees about as many old objects as it makes new ones, so that count hardly moves: the
automatic collections then come seconds apart, and each scans everything born since the last
one. In the dispatch core at 1,385 requests/s that was 3,000 requests' records and key
tuples, and passes of 10-80 ms, each a stall of every request waiting for its placement.
`pace` collects the young generation every `INTERVAL_S` instead, so a pass scans only what
the last interval made, and goes on to the older generations when the collector's thresholds
say so. A full pass scans every object in flight (25,000 in that core: about 10 ms), and in a
steady state it finds next to nothing (no request leaves a cycle), so `pace` raises the
oldest threshold to `OLD_PASSES`: a full pass about once a minute, not every few seconds.
"""
from __future__ import annotations

import asyncio
import gc

INTERVAL_S = 0.05
OLD_PASSES = 100  # middle-generation passes between full ones (CPython's default: 10)


def collect_due() -> int:
    """One paced collection: the oldest generation whose count is past its threshold, else the
    young one (-1: the collector is off, nothing run). Returns the generation collected."""
    counts, thresholds = gc.get_count(), gc.get_threshold()
    if not gc.isenabled() or thresholds[0] == 0:
        return -1
    gen = 2 if counts[2] > thresholds[2] else 1 if counts[1] > thresholds[1] else 0
    gc.collect(gen)
    return gen


async def pace(interval_s: float = INTERVAL_S) -> None:
    """Run `collect_due` every `interval_s`, for the life of the service."""
    young, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, max(old, OLD_PASSES))
    while True:
        await asyncio.sleep(interval_s)
        collect_due()
