"""A request's state at the scheduler: one enum, the legal moves, and `Lifecycle.move`, their only writer.

Owns the counts that /health and the metrics read (so the two cannot disagree) and the
request's trace events for each move (shared/lifecycle.py). Never does I/O; an illegal move
raises and is counted.
"""
from __future__ import annotations

import enum

from shared import lifecycle
from shared.lifecycle import IllegalTransition

__all__ = ["IllegalTransition", "LEGAL", "Lifecycle", "ReqState", "TERMINAL"]


class ReqState(enum.StrEnum):
    QUEUED = "queued"  # waiting for an engine pair (first attempt, or again after a resume)
    PREFILLING = "prefilling"  # placed on a prefill and a decode engine, no token yet
    DECODING = "decoding"  # its first token came: the decode engine streams the rest
    RESUMING = "resuming"  # its engine failed: a new attempt is being prepared
    DONE = "done"  # answered in full (length, stop, eos)
    FAILED = "failed"  # answered with an error event
    CANCELLED = "cancelled"  # the client left


TERMINAL = frozenset({ReqState.DONE, ReqState.FAILED, ReqState.CANCELLED})
WAITING = frozenset({ReqState.QUEUED})
RUNNING = frozenset({ReqState.PREFILLING, ReqState.DECODING, ReqState.RESUMING})
_OUT = frozenset({ReqState.RESUMING, *TERMINAL})
LEGAL: dict[ReqState, frozenset[ReqState]] = {
    ReqState.QUEUED: frozenset({ReqState.PREFILLING, *TERMINAL}),
    ReqState.PREFILLING: frozenset({ReqState.DECODING, *_OUT}),
    ReqState.DECODING: _OUT,
    ReqState.RESUMING: frozenset({ReqState.QUEUED, *TERMINAL}),
    **{s: frozenset() for s in TERMINAL},
}
STATUS_STATE = {"ok": ReqState.DONE, "error": ReqState.FAILED, "cancelled": ReqState.CANCELLED}


class Lifecycle(lifecycle.Lifecycle[ReqState]):
    """Live requests by state. `enter` puts one in QUEUED; `move` changes it (and only it writes
    `rec.state`); a terminal move takes it out of the counts."""

    def __init__(self) -> None:
        super().__init__(LEGAL)

    def enter(self, rec, state: ReqState = ReqState.QUEUED, why: str = "accepted") -> None:
        super().enter(rec, state, why)

    def end(self, rec, status: str, why: str = "") -> None:
        """The client had its last event: the terminal state for `status` (ok | error | cancelled)."""
        if rec.state is not None and rec.state not in TERMINAL:
            self.move(rec, STATUS_STATE.get(status, ReqState.FAILED), why or status)

    def waiting(self) -> int:
        return self.count(WAITING)

    def running(self) -> int:
        return self.count(RUNNING)
