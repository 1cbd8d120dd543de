"""A state machine over an enum: its legal moves, `StateMachine.move` their only writer, live counts by state.

An illegal move raises `IllegalTransition`, is counted and changes nothing. Pure: no I/O, no clock.
"""
from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Generic, TypeVar

E = TypeVar("E", bound=enum.Enum)
OnMove = Callable[[object, "enum.Enum | None", "enum.Enum", str], None]  # (record, from (None: entered), to, why)


class IllegalTransition(Exception):
    def __init__(self, key: str, src, dst, what: str = "request"):
        super().__init__(f"{what} {key}: {src} -> {dst} is not a legal move")
        self.key = self.req_id = key
        self.src, self.dst = src, dst


def legal_table(paths: Mapping[E, Iterable[E]], ends: Iterable[E], terminal: Iterable[E]) -> dict[E, frozenset[E]]:
    """Each live state's moves: its own (`paths`) and every one of `ends`; terminal states have none."""
    ends = frozenset(ends)
    return {**{s: frozenset(nxt) | ends for s, nxt in paths.items()}, **{s: frozenset() for s in terminal}}


class StateMachine(Generic[E]):
    """Only `enter` and `move` write `rec.state`; `counts` holds the live (non-terminal) states only."""

    def __init__(self, legal: Mapping[E, frozenset[E]], terminal: frozenset[E], what: str = "request",
                 on_move: OnMove | None = None):
        self.legal, self.terminal, self.what, self.on_move = legal, terminal, what, on_move
        self.counts: Counter[E] = Counter()
        self.illegal = 0

    def enter(self, rec, state: E, why: str = "") -> None:
        if state in self.terminal or getattr(rec, "state", None) is not None:
            self.illegal += 1
            raise IllegalTransition(_key(rec), getattr(rec, "state", None), state, self.what)
        rec.state = state
        self.counts[state] += 1
        if self.on_move is not None:
            self.on_move(rec, None, state, why)

    def move(self, rec, dst: E, why: str = "") -> None:
        src = rec.state
        if src is None or dst not in self.legal[src]:
            self.illegal += 1
            raise IllegalTransition(_key(rec), src, dst, self.what)
        self.counts[src] -= 1
        if dst not in self.terminal:
            self.counts[dst] += 1
        rec.state = dst
        if self.on_move is not None:
            self.on_move(rec, src, dst, why)

    def total(self, states: Iterable[E]) -> int:
        return sum(self.counts[s] for s in states)

    def live(self) -> dict[str, int]:
        return {str(s): self.counts[s] for s in self.legal if s not in self.terminal}


def _key(rec) -> str:
    return str(getattr(rec, "req_id", None) or getattr(rec, "owner", None) or rec)
