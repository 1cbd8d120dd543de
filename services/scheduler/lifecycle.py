"""A request's state at the scheduler: one enum, the legal moves, and `Lifecycle.move`, their only writer.

/health and the metrics read the same counts, so they cannot disagree. No I/O."""
from __future__ import annotations

import enum

from opentelemetry import trace

from shared.states import IllegalTransition, StateMachine

__all__ = ["IllegalTransition", "LEGAL", "Lifecycle", "ReqState", "RUNNING", "STATUS_STATE", "TERMINAL", "WAITING"]


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


class Lifecycle(StateMachine[ReqState]):
    """Live requests by state; a terminal move takes one out of the counts."""

    def __init__(self) -> None:
        super().__init__(LEGAL, TERMINAL, on_move=_event)

    def enter(self, rec, state: ReqState = ReqState.QUEUED, why: str = "accepted") -> None:
        super().enter(rec, state, why)

    def end(self, rec, status: str, why: str = "") -> None:
        """The client had its last event: the terminal state for `status` (ok | error | cancelled)."""
        if rec.state is not None and rec.state not in TERMINAL:
            self.move(rec, STATUS_STATE.get(status, ReqState.FAILED), why or status)

    def waiting(self) -> int:
        return self.total(WAITING)

    def running(self) -> int:
        return self.total(RUNNING)


def _event(rec, src: ReqState | None, state: ReqState, why: str) -> None:
    span = trace.get_current_span(rec.ctx) if rec.ctx is not None else None
    if span is not None and span.is_recording():
        span.add_event("state", {"req_id": rec.req_id, "state": str(state), "why": why})
