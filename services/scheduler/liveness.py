"""Which engines the scheduler declares dead, and which requests it must act on then.

Pure: the caller passes the clock and acts."""
from __future__ import annotations

from collections.abc import Iterable

from services.scheduler.inflight import InFlight


def strands(rec: InFlight, engine: str) -> bool:
    """`rec` cannot go on without `engine` (a PE that died after its DE streamed tokens strands nothing)."""
    if engine not in (rec.pe, rec.de) or rec.finished:
        return False
    return not (engine == rec.pe and rec.de != engine and rec.next_index > rec.step0 + 1)


def stranded(recs: Iterable[InFlight], engines: list[str]) -> list[tuple[InFlight, str]]:
    """The requests the dead `engines` strand, each once, with the first engine that strands it."""
    dead = set(engines)
    if not dead:
        return []
    rank = {e: i for i, e in enumerate(engines)}
    out = []
    for rec in recs:
        hit = [e for e in (rec.pe, rec.de) if e in dead and strands(rec, e)]
        if hit:
            out.append((rec, min(hit, key=rank.__getitem__)))
    return out


def unassigned_past(recs: Iterable[InFlight], now: float, timeout_s: float) -> list[InFlight]:
    return [rec for rec in recs if not rec.pe and now - rec.queued_at > timeout_s]


class Watch:
    """Which silent engines are dead, judged against the scheduler's own stalls: none when this check
    came late, and only the long silent when the whole fleet or most of it went quiet."""

    def __init__(self, timeout_s: float, hold: float = 2.0):
        self.timeout_s, self.hold = timeout_s, hold
        self.last_tick: float | None = None
        self.last_heard: float | None = None  # the latest engine or TM announcement
        self.reason = ""  # why the last judgement held engines back ("": it did not)

    def heard(self, now: float) -> None:
        self.last_heard = now

    def judge(self, now: float, silent: dict[str, float], known: int) -> list[str]:
        """The engines of `silent` (engine -> seconds) to declare dead now, sorted."""
        lag = 0.0 if self.last_tick is None else now - self.last_tick
        self.last_tick, self.reason = now, ""
        if not silent:
            return []
        if lag > self.timeout_s / 2:
            self.reason = f"the scheduler itself stalled {lag:.1f} s"
            return []
        quiet = self.last_heard is None or now - self.last_heard > self.timeout_s
        if quiet or (len(silent) > 1 and len(silent) > known / 2):
            self.reason = "no engine heard at all" if quiet else f"{len(silent)} of {known} engines silent at once"
            return sorted(e for e, age in silent.items() if age > self.hold * self.timeout_s)
        return sorted(silent)
