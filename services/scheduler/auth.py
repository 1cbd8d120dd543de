"""API keys on the HTTP front door (when configured): `Authorization: Bearer <key>`.

Keys are compared in constant time and never logged; `open_paths` stay open."""
from __future__ import annotations

import hmac
import json


class ApiKeyMiddleware:
    def __init__(self, app, keys: tuple[str, ...], open_paths: tuple[str, ...] = ("/health", "/openapi.json")):
        self.app = app
        self.keys = [k.encode() for k in keys if k]
        self.open_paths = open_paths

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.keys or scope.get("path") in self.open_paths:
            return await self.app(scope, receive, send)
        if self.authorized(dict(scope.get("headers") or [])):
            return await self.app(scope, receive, send)
        body = json.dumps({"error": {"message": "missing or invalid API key (Authorization: Bearer <key>)",
                                     "type": "authentication_error", "param": None, "code": 401}}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b'Bearer realm="dualpath"')]})
        await send({"type": "http.response.body", "body": body})

    def authorized(self, headers: dict[bytes, bytes]) -> bool:
        value = headers.get(b"authorization", b"")
        scheme, _, token = value.partition(b" ")
        if scheme.lower() != b"bearer" or not token:
            return False
        ok = False
        for key in self.keys:  # no early exit: the time does not depend on which key matched
            ok |= hmac.compare_digest(token.strip(), key)
        return ok
