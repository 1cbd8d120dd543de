"""What the prefill engine's collaborators (fetch, hand-off) say should happen to a request: the engine does it.

They never call into the engine: a step returns a list of these (an async step yields them as
they come, in order), and the engine (app.py) carries each out, moving the request's state
(life.py). None of them does anything by itself.
"""
from __future__ import annotations

from dataclasses import dataclass

from services.prefill_engine.record import PrefillRequest
from shared.messages.codes import ErrorCode
from shared.messages.traffic_manager import FetchKV


@dataclass(frozen=True)
class Ready:
    """Its stored KV is read (or it is a miss after all): queue it to compute when its read ends in
    `eta_s` less its own compute time (its compute then overlaps the read's tail)."""
    req: PrefillRequest
    eta_s: float = 0.0


@dataclass(frozen=True)
class Send:
    """Its KV blocks are allocated: send its storage read (`Fetcher.send`) and start its deadline
    (`Fetcher.deadline`)."""
    req: PrefillRequest
    fetch: FetchKV


@dataclass(frozen=True)
class Fail:
    """Answer it with an error (retryable: its scheduler resumes it elsewhere) and release it now,
    or (`release` False) let whoever still holds it release it later."""
    req: PrefillRequest
    code: ErrorCode
    error: str
    retryable: bool = True
    release: bool = True


@dataclass(frozen=True)
class LoadFailed:
    """Its stored KV will not all arrive: a forward computing it fails it (LoadError); else fail it
    (retryable) now."""
    req: PrefillRequest
    code: ErrorCode
    error: str


@dataclass(frozen=True)
class Abandon:
    """Fail it (retryable) now and tell its traffic manager to stop; free its blocks once no copy
    targets them."""
    req: PrefillRequest
    code: ErrorCode
    error: str


@dataclass(frozen=True)
class Free:
    """Free its KV blocks and drop its record."""
    req: PrefillRequest


Outcome = Ready | Send | Fail | LoadFailed | Abandon | Free
