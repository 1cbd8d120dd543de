"""Where a request is in the prefill engine: one enum, the legal moves, and `PeLife.move`, their only writer.

Every live state has a way out on failure, deadline and cancel; an illegal move raises."""
from __future__ import annotations

import enum

from opentelemetry import trace

from services.prefill_engine.metrics import PrefillMetrics
from shared.states import IllegalTransition, StateMachine

tracer = trace.get_tracer("prefill_engine")


class PeState(enum.StrEnum):
    WAITING_BLOCKS = "waiting_blocks"  # its stored hits wait for KV blocks to load into (FIFO)
    READING = "reading"  # its storage read is in flight: the traffic manager has not reported it
    LOADING = "loading"  # the read reported, its layers land: it joins the queue when its read is about to end
    READY = "ready"  # queued to compute: a miss from intake on, a loaded one, a chunked prompt between forwards
    COMPUTING = "computing"  # in the running forward (layer l computed while later layers may still land)
    HANDING_OFF = "handing_off"  # first token sampled: sent, its KV pushed and admitted at the DE (or persisted here)
    CANCELLING = "cancelling"  # the client left while a forward or its hand-off runs it: that one ends it
    CANCELLED = "cancelled"  # the client left: released once no storage read or layer copy targets its blocks
    FAILED = "failed"  # answered with an error: released once nothing targets its blocks (by its hand-off, if any)
    RELEASED = "released"  # its KV blocks freed, its record dropped


P = PeState
WAITING = frozenset({P.WAITING_BLOCKS, P.READY})  # waiting for prefill (queue_length)
HELD = frozenset({P.COMPUTING, P.HANDING_OFF, P.CANCELLING})  # a forward or a hand-off holds it: that one ends it
ENDING = frozenset({P.CANCELLING, P.CANCELLED, P.FAILED, P.RELEASED})  # answered, or its client left
_OUT = frozenset({P.CANCELLED, P.FAILED})
LEGAL: dict[PeState, frozenset[PeState]] = {
    P.WAITING_BLOCKS: frozenset({P.READING, P.READY, *_OUT}),  # READY: copied straight from a TM buffer
    P.READING: frozenset({P.LOADING, P.READY, *_OUT}),
    P.LOADING: frozenset({P.READY, *_OUT}),
    P.READY: frozenset({P.COMPUTING, *_OUT}),
    P.COMPUTING: frozenset({P.READY, P.HANDING_OFF, P.CANCELLING, P.FAILED}),  # READY: a chunk, or computed again
    P.HANDING_OFF: frozenset({P.RELEASED, P.CANCELLING, P.FAILED}),
    P.CANCELLING: frozenset({P.CANCELLED, P.RELEASED}),  # CANCELLED: its forward ended without a first token
    P.CANCELLED: frozenset({P.RELEASED}),
    P.FAILED: frozenset({P.RELEASED}),
    P.RELEASED: frozenset(),
}


TERMINAL = frozenset(s for s, out in LEGAL.items() if not out)


def _event(req, src, state: PeState, why: str) -> None:
    span = getattr(req, "span", None)
    if span is not None and span.is_recording():
        span.add_event("state", {"req_id": req.req_id, "state": str(state), "why": why})


class PeLife(StateMachine[PeState]):
    """The requests an engine holds, by state; each request's span records its moves as events."""

    def __init__(self, engine: str = "", pm: PrefillMetrics | None = None):
        super().__init__(LEGAL, TERMINAL, on_move=_event)
        self.engine, self.pm = engine, pm

    def enter(self, req, state: PeState, why: str = "") -> None:
        req.span = tracer.start_span("prefill_request", context=req.ctx,
                                     attributes={"req_id": req.req_id, "engine": self.engine})
        super().enter(req, state, why)
        self._note(state)

    def move(self, req, dst: PeState, why: str = "") -> None:
        src = req.state
        try:
            super().move(req, dst, why)
        except IllegalTransition:
            if self.pm is not None:
                self.pm.illegal.inc()
            raise
        self._note(src, dst)
        if dst is PeState.RELEASED and req.span is not None:
            req.span.end()

    def held(self) -> int:
        """Requests not released yet (the announcement's `seq`)."""
        return sum(self.counts.values())

    def waiting(self) -> int:
        """Requests waiting for KV blocks or queued to compute (`queue_length`)."""
        return self.total(WAITING)

    def _note(self, *states: PeState) -> None:
        if self.pm is None:
            return
        for s in states:
            if s not in self.terminal:
                self.pm.states.labels(str(s)).set(self.counts[s])
        self.pm.queue.set(self.waiting())
