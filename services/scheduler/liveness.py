"""Which requests the scheduler must act on when engines go silent or nothing takes them.

Owns the two selections the liveness loop makes over the requests in flight: those an
engine that stopped heartbeating leaves stranded (to resume elsewhere, or fail), and
those no engine took in time (to fail). Pure: the caller passes the clock and acts.
"""
from __future__ import annotations

from collections.abc import Iterable

from services.scheduler.inflight import InFlight


def stranded(recs: Iterable[InFlight], engine: str) -> list[InFlight]:
    """Unfinished requests that `engine` holds and that cannot go on without it. A request
    whose prefill engine died after its decode engine produced tokens is not stranded."""
    out = []
    for rec in recs:
        if engine not in (rec.pe, rec.de) or rec.finished:
            continue
        if engine == rec.pe and rec.de != engine and rec.next_index > rec.step0 + 1:
            continue  # its decode engine already holds it: the prefill side is done
        out.append(rec)
    return out


def unassigned_past(recs: Iterable[InFlight], now: float, timeout_s: float) -> list[InFlight]:
    """Requests that have waited for an engine pair longer than `timeout_s`."""
    return [rec for rec in recs if not rec.pe and now - rec.queued_at > timeout_s]
