"""Bearer API key for the /v1 routes (pure ASGI, so it also guards unknown /v1 paths)."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from api.errors import Unauthorized


class RequireAPIKey:
    """Refuse with 401 unless `Authorization: Bearer <key>` matches (constant-time compare)."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self._key = key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            header = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, token = header.partition(b" ")
            if scheme.lower() != b"bearer" or not token.strip():
                raise Unauthorized("Missing API key: send it as 'Authorization: Bearer <key>'.")
            if not hmac.compare_digest(token.strip(), self._key):
                raise Unauthorized("Incorrect API key provided.")
        await self.app(scope, receive, send)
