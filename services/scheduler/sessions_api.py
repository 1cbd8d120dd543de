"""SGLang's session endpoints on the front door: POST /open_session and POST /close_session.

Closing a session ends its retention as an `agent_hints.release` would."""
from __future__ import annotations

import uuid
from typing import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from services.scheduler.front import Front
from services.scheduler.hint_shapes import CloseSession, OpenSession
from services.scheduler.protocol import decode_body

ReadBody = Callable[[Request, int], Awaitable[bytes]]  # the handlers' body reader (413 past the limit)


def session_routes(svc: Front, read_body: ReadBody) -> list[Route]:
    async def open_session(request: Request) -> Response:
        body = decode_body(await read_body(request, svc.cfg.max_body_bytes) or b"{}", OpenSession)
        return JSONResponse(body.session_id or f"session-{uuid.uuid4().hex}")

    async def close_session(request: Request) -> Response:
        body = decode_body(await read_body(request, svc.cfg.max_body_bytes) or b"{}", CloseSession)
        await svc.end_session(body.session_id)
        return Response(status_code=200)

    return [Route("/open_session", open_session, methods=["POST"]),
            Route("/close_session", close_session, methods=["POST"])]
