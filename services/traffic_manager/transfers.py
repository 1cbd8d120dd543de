"""A transfer's state at the traffic manager: one enum, each kind's legal moves, and `Transfers.move`, their only writer.

Every live state has a way out on failure, release and deadline."""
from __future__ import annotations

import enum
import logging
from collections import Counter

from opentelemetry import trace

from services.traffic_manager.progress import Stalled
from services.traffic_manager.waitline import SlotWaitExpired
from shared.engine.requests import RecentSet
from shared.metrics import Metrics
from shared.states import IllegalTransition, StateMachine, legal_table
from shared.transport.errors import TransferTimeout

log = logging.getLogger("traffic_manager")


class TransferKind(enum.StrEnum):
    FETCH = "fetch"  # stored hit blocks -> buffers -> KV memory (fetch.py)
    PUSH = "push"  # KV memory -> a decode engine's buffer (push.py)
    RESERVE = "reserve"  # buffer slots for a request another TM pushes or stages into
    LOAD = "load"  # buffer -> KV memory (decode side)
    SAVE = "save"  # KV memory (or buffer slots) -> the store (store_path.py)
    STAGE = "stage"  # hit blocks read into this buffer for another TM's fetch (store_path.py)
    PREFETCH = "prefetch"  # a session's stored blocks staged in spare slots (prefetch.py)
    KEPT = "kept"  # a decode turn's saved blocks kept for its next turn (pending.py)


class TransferState(enum.StrEnum):
    RESERVING = "reserving"  # waiting for buffer slots (here or at the decode engine's TM), or claiming prefetched ones
    QUEUED = "queued"  # a save waiting in the save line for spare buffer room
    READING = "reading"  # storage reads landing in buffer slots
    COPYING = "copying"  # on the data plane: buffer <-> KV memory, or to / from another TM's buffer
    WRITING = "writing"  # a save's blocks going from the buffer to the store (the engine was answered)
    STAGED = "staged"  # blocks sitting in the buffer for a claim
    CLAIMED = "claimed"  # a fetch copies from them (pinned until released or the lease ends)
    DONE = "done"
    FAILED = "failed"
    RELEASED = "released"  # its request was released or cancelled (or its slots reclaimed)
    EXPIRED = "expired"  # past its deadline


T = TransferState
TERMINAL = frozenset({T.DONE, T.FAILED, T.RELEASED, T.EXPIRED})
ENDS = frozenset({T.FAILED, T.RELEASED, T.EXPIRED})  # every live state's ways out
PATHS: dict[TransferKind, dict[TransferState, set[TransferState]]] = {
    TransferKind.FETCH: {T.RESERVING: {T.READING}, T.READING: {T.COPYING, T.DONE}, T.COPYING: {T.DONE}},
    TransferKind.PUSH: {T.RESERVING: {T.COPYING}, T.COPYING: {T.DONE}},
    TransferKind.RESERVE: {T.RESERVING: {T.DONE}},
    TransferKind.LOAD: {T.COPYING: {T.DONE}},
    TransferKind.SAVE: {T.QUEUED: {T.COPYING, T.DONE}, T.COPYING: {T.WRITING}, T.WRITING: {T.DONE}},
    TransferKind.STAGE: {T.RESERVING: {T.READING}, T.READING: {T.DONE}},
    TransferKind.PREFETCH: {T.READING: {T.STAGED, T.CLAIMED, T.DONE}, T.STAGED: {T.CLAIMED, T.DONE}, T.CLAIMED: {T.DONE}},
    TransferKind.KEPT: {T.STAGED: {T.CLAIMED, T.DONE}, T.CLAIMED: {T.DONE}},
}
LEGAL = {kind: legal_table(paths, ENDS, TERMINAL) for kind, paths in PATHS.items()}


class Transfer:
    """One handler's transfer; as a context manager it ends with the block's exception or `error`."""

    __slots__ = ("kind", "req_id", "state", "error", "_owner")

    def __init__(self, kind: TransferKind, req_id: str, owner: "Transfers"):
        self.kind, self.req_id, self.state, self.error, self._owner = kind, req_id, None, None, owner

    def __enter__(self) -> "Transfer":
        return self

    def __exit__(self, et, exc, tb) -> bool:
        self._owner.end(self, exc if exc is not None else self.error)
        return False


class Transfers:
    """The TM's live transfers by kind and state, one machine per kind."""

    def __init__(self) -> None:
        self.machines = {k: StateMachine(LEGAL[k], TERMINAL, what=f"{k} of", on_move=_event) for k in TransferKind}
        self.ended: Counter[tuple[TransferKind, TransferState]] = Counter()
        self.released = RecentSet()

    def expose(self, metrics: Metrics) -> None:
        metrics.live_gauge("transfers", "Live transfers by kind and state", ("kind", "state"), self._live)
        metrics.live_gauge("transfers_ended_total", "Transfers ended, by kind and terminal state", ("kind", "state"),
                           lambda: [((str(k), str(s)), n) for (k, s), n in self.ended.items()], counter=True)
        metrics.live_gauge("illegal_transitions_total", "Transfer state moves refused as illegal (a bug)", (),
                           lambda: [((), sum(m.illegal for m in self.machines.values()))], counter=True)

    def begin(self, kind: TransferKind, req_id: str, state: TransferState) -> Transfer:
        t = Transfer(kind, req_id, self)
        self.machines[kind].enter(t, state)
        return t

    def enter(self, rec, state: TransferState) -> None:
        """A record of its own (a staged entry) enters `state`, once."""
        try:
            self.machines[rec.kind].enter(rec, state)
        except IllegalTransition as exc:
            log.error("%s (entered again)", exc)

    def move(self, rec, dst: TransferState, why: str = "") -> bool:
        """An illegal move is a bug: logged and counted, never fatal."""
        if rec.state is dst:
            return True
        try:
            self.machines[rec.kind].move(rec, dst, why)
        except IllegalTransition as exc:
            log.error("%s (%s)", exc, why)
            return False
        if dst in TERMINAL:
            self.ended[(rec.kind, dst)] += 1
        return True

    def end(self, rec, error: BaseException | TransferState | None = None, why: str = "") -> None:
        """`rec` is over: DONE, or RELEASED, EXPIRED, FAILED from `error`. Only the first end counts."""
        if rec.state is None or rec.state in TERMINAL:
            return
        if isinstance(error, TransferState):
            dst = error
        elif error is None:
            dst = T.DONE
        else:
            dst = T.RELEASED if rec.req_id in self.released else T.EXPIRED if deadline(error) else T.FAILED
            why = why or f"{type(error).__name__}: {error}"
        self.move(rec, dst, why)

    def release(self, req_id: str) -> None:
        """`req_id` was released or cancelled: its transfers that fail from now on end RELEASED."""
        self.released.add(req_id)

    def live(self) -> dict[str, dict[str, int]]:
        return {str(k): m.live() for k, m in self.machines.items()}

    def _live(self):
        return [((str(k), s), n) for k, m in self.machines.items() for s, n in m.live().items()]


def deadline(exc: BaseException) -> bool:
    """`exc`, or what it was raised from, is a deadline that passed."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, (TimeoutError, TransferTimeout, Stalled, SlotWaitExpired)):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _event(rec, src: TransferState | None, dst: TransferState, why: str) -> None:
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event("transfer", {"kind": str(rec.kind), "req_id": str(rec.req_id), "state": str(dst), "why": why})
