"""What the prefill engine's collaborators (fetch, hand-off) say should happen to a request: the engine does it.

None of them does anything by itself."""
from __future__ import annotations

from dataclasses import dataclass

from services.prefill_engine.record import PrefillRequest
from shared.messages.codes import ErrorCode
from shared.messages.traffic_manager import FetchKV


@dataclass(frozen=True)
class Ready:
    """Queue it to compute when its read ends in `eta_s` less its own compute time."""
    req: PrefillRequest
    eta_s: float = 0.0


@dataclass(frozen=True)
class Send:
    """Send its storage read (`Fetcher.send`) and start its deadline (`Fetcher.deadline`)."""
    req: PrefillRequest
    fetch: FetchKV


@dataclass(frozen=True)
class Fail:
    """Answer it with an error and release it now, or (`release` False) let its holder release it."""
    req: PrefillRequest
    code: ErrorCode
    error: str
    retryable: bool = True
    release: bool = True


@dataclass(frozen=True)
class LoadFailed:
    """Its stored KV will not all arrive: fail the forward computing it, else fail it now."""
    req: PrefillRequest
    code: ErrorCode
    error: str


@dataclass(frozen=True)
class Abandon:
    """Fail it (retryable) now and stop its TM; free its blocks once no copy targets them."""
    req: PrefillRequest
    code: ErrorCode
    error: str


@dataclass(frozen=True)
class Free:
    """Free its KV blocks and drop its record."""
    req: PrefillRequest


Outcome = Ready | Send | Fail | LoadFailed | Abandon | Free
