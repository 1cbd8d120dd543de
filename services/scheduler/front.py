"""What the HTTP front door may ask of the scheduler: the `Front` protocol.

Imports neither side, so `api` and `app` never import each other."""
from __future__ import annotations

from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response

from services.scheduler.config import SchedulerConfig
from services.scheduler.inflight import InFlight


class Front(Protocol):
    cfg: SchedulerConfig
    tokenizer: Any  # encode / apply_chat_template / vocab_size, and what IncrementalDecoder needs

    def model_id(self) -> str:
        """The id clients send as `model` (empty until an engine announced one)."""

    def accepts_model(self, name: str | None) -> bool: ...

    def max_context(self) -> int:
        """The smallest context any live engine serves (0: none announced)."""

    async def health(self) -> tuple[bool, dict]:
        """(serving?, the JSON body of /health)."""

    async def mesh(self) -> dict:
        """The JSON body of /v1/mesh: every announced process, the model and its limits."""

    async def metrics_endpoint(self, request: Request) -> Response: ...

    async def admit(self, rec: InFlight) -> None:
        """Look up the prompt's stored blocks, then queue the request for an engine pair."""

    def cancel(self, rec: InFlight, reason: str) -> None:
        """Free the request everywhere, from a task the service owns (the caller may be cancelled)."""

    def finish(self, rec: InFlight, status: str) -> None:
        """The client got its last event: count it and forget the request."""

    async def end_session(self, session: str) -> None:
        """The agent session is over: its retention ends, what was staged for it goes back."""
