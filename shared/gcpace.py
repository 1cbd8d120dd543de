"""Collections at a steady pace, so a service in steady state never pauses long for one.

Young passes every `INTERVAL_S`, so each scans one interval's objects; full passes are rare.
"""
from __future__ import annotations

import asyncio
import gc

INTERVAL_S = 0.05
OLD_PASSES = 100  # middle-generation passes between full ones (CPython's default: 10)


def collect_due() -> int:
    """Collect the oldest generation past its threshold, else the young one; returns it (-1: gc off)."""
    counts, thresholds = gc.get_count(), gc.get_threshold()
    if not gc.isenabled() or thresholds[0] == 0:
        return -1
    gen = 2 if counts[2] > thresholds[2] else 1 if counts[1] > thresholds[1] else 0
    gc.collect(gen)
    return gen


async def pace(interval_s: float = INTERVAL_S) -> None:
    young, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, max(old, OLD_PASSES))
    while True:
        await asyncio.sleep(interval_s)
        collect_due()
