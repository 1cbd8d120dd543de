"""A request's state machine: its legal moves, and `Lifecycle.move`, the only writer of `rec.state`.

A service names its states (an enum) and the moves each allows; a state with no way out is
terminal and leaves the counts. Every move is an event ("state", with its why) on the request's
span (`rec.span` when it has one, else the span in `rec.ctx`). Never does I/O; an illegal move
raises `IllegalTransition` and is counted.
"""
from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Generic, TypeVar

from opentelemetry import trace

S = TypeVar("S", bound=enum.Enum)


class IllegalTransition(Exception):
    def __init__(self, req_id: str, src: Any, dst: Any):
        super().__init__(f"request {req_id}: {src} -> {dst} is not a legal move")
        self.req_id, self.src, self.dst = req_id, src, dst


class Lifecycle(Generic[S]):
    """Live requests by state. `enter` puts one in its first state; `move` changes it (and only it
    writes `rec.state`); a move into a terminal state takes it out of the counts."""

    def __init__(self, legal: Mapping[S, frozenset[S]]):
        self.legal = legal
        self.terminal = frozenset(s for s, out in legal.items() if not out)
        self.counts: Counter[S] = Counter()
        self.illegal = 0

    def enter(self, rec: Any, state: S, why: str = "") -> None:
        rec.state = state
        self.counts[state] += 1
        event(rec, state, why)

    def move(self, rec: Any, dst: S, why: str = "") -> None:
        src = rec.state
        if src is None or dst not in self.legal[src]:
            self.illegal += 1
            raise IllegalTransition(rec.req_id, src, dst)
        self.counts[src] -= 1
        if dst not in self.terminal:
            self.counts[dst] += 1
        rec.state = dst
        event(rec, dst, why)

    def count(self, states: Iterable[S]) -> int:
        return sum(self.counts[s] for s in states)

    def live(self) -> dict[str, int]:
        """Count of each non-terminal state."""
        return {str(s): self.counts[s] for s in self.legal if s not in self.terminal}


def event(rec: Any, state: Any, why: str) -> None:
    """The move as an event on the request's span (none when it is not recording)."""
    span = getattr(rec, "span", None)
    if span is None and rec.ctx is not None:
        span = trace.get_current_span(rec.ctx)
    if span is not None and span.is_recording():
        span.add_event("state", {"req_id": rec.req_id, "state": str(state), "why": why})
