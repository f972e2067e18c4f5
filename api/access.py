"""One access-log line per request on `api.access`, written when the response (or stream) ends."""

from __future__ import annotations

import logging
import time

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("api.access")

_SCOPE_KEY = "mlx_cluster_serve.access"


class AccessRecord:
    """What the handlers learn about a request; the middleware logs it."""

    __slots__ = ("request_id", "prompt_tokens", "completion_tokens", "outcome")

    def __init__(self) -> None:
        self.request_id = "-"
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        # set when a stream ends other than normally: an error code or "client_disconnected"
        self.outcome: str | None = None


def access_record(request: Request) -> AccessRecord:
    """This request's record (a throwaway one when the middleware is not installed)."""
    return request.scope.setdefault(_SCOPE_KEY, AccessRecord())


class AccessLog:
    """Pure ASGI middleware: measures until the last byte, so streams are logged with their tokens."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = scope[_SCOPE_KEY] = AccessRecord()
        status = 500
        start = time.perf_counter()

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            # health probes are frequent; keep them out of the INFO log unless they fail
            level = logging.DEBUG if scope["path"] == "/health" and status == 200 else logging.INFO
            if logger.isEnabledFor(level):
                logger.log(
                    level,
                    "%s %s %s %d prompt_tokens=%s completion_tokens=%s duration=%.3fs%s",
                    record.request_id,
                    scope["method"],
                    scope["path"],
                    status,
                    "-" if record.prompt_tokens is None else record.prompt_tokens,
                    "-" if record.completion_tokens is None else record.completion_tokens,
                    time.perf_counter() - start,
                    f" outcome={record.outcome}" if record.outcome else "",
                )
