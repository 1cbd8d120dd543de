"""A request's state at a decode engine: one enum, the legal moves, and `DeLife.move`, their only writer.

Every live state has a way out on failure, on cancel, and by a deadline."""
from __future__ import annotations

import enum
import logging

from opentelemetry import trace

from shared.metrics import Metrics
from shared.states import IllegalTransition, StateMachine, legal_table

log = logging.getLogger("decode_engine")


class DeState(enum.StrEnum):
    ADMITTED = "admitted"  # acknowledged, its KV in the TM's buffer: waits (FIFO) for KV blocks
    LOADING = "loading"  # KV blocks taken: its TM copies the buffer -> KV memory
    RUNNING = "running"  # in the running batch (or joining it at the next step)
    STOPPING = "stopping"  # cancelled, or its background work failed: leaves after the load or step under way
    PERSISTING = "persisting"  # over, its blocks kept until its saves are copied out of them
    DONE = "done"  # finished (stop, length): blocks freed
    CANCELLED = "cancelled"  # cancelled: blocks (and, admitted, its TM's buffer slots) freed
    FAILED = "failed"  # answered with an error event: blocks freed


S = DeState
TERMINAL = frozenset({S.DONE, S.CANCELLED, S.FAILED})
LIVE = frozenset(set(S) - TERMINAL)
LEGAL = legal_table({
    S.ADMITTED: {S.LOADING, S.CANCELLED},
    S.LOADING: {S.RUNNING, S.STOPPING},
    S.RUNNING: {S.STOPPING, S.PERSISTING, S.DONE},
    S.STOPPING: {S.PERSISTING, S.CANCELLED},
    S.PERSISTING: {S.DONE, S.CANCELLED},
}, ends={S.FAILED}, terminal=TERMINAL)


class DeLife(StateMachine[DeState]):
    """The decode engine's requests by state; an illegal move is logged and counted, never fatal."""

    def __init__(self, metrics: Metrics):
        super().__init__(LEGAL, TERMINAL, on_move=_event)
        self.m_illegal = metrics.counter("illegal_transitions_total", "Request state moves refused as illegal (a bug)")
        metrics.live_gauge("requests", "Requests held, by state", ("state",),
                           lambda: [((s,), n) for s, n in self.live().items()])

    def try_move(self, rec, dst: DeState, why: str = "") -> bool:
        try:
            self.move(rec, dst, why)
        except IllegalTransition as exc:
            log.error("%s (%s)", exc, why)
            self.m_illegal.inc()
            return False
        return True

    def held(self) -> int:
        """Requests the engine holds (live): the announcement's `seq`."""
        return self.total(LIVE)


def _event(rec, src: DeState | None, state: DeState, why: str) -> None:
    span = rec.span if rec.span is not None else trace.get_current_span()
    if span.is_recording():
        span.add_event("state", {"req_id": rec.req_id, "state": str(state), "why": why})
