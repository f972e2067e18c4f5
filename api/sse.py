"""Server-Sent Events: `data: {json}` frames, and a response that always runs its cleanup."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from api.errors import APIError
from api.bodies import encode

DONE = b"data: [DONE]\n\n"


def event(obj: Any) -> bytes:
    """One SSE data frame holding obj as JSON (JSON escapes newlines, so one line)."""
    return b"data: " + encode(obj) + b"\n\n"


def error_event(exc: APIError) -> bytes:
    """How an error travels once the 200 and the SSE headers are out."""
    return event(exc.body())


class EventStreamResponse(StreamingResponse):
    """A text/event-stream response (or another streamed media type) whose on_close runs however the stream ends.

    Starlette cancels the body when the client disconnects (its disconnect race); the body
    iterator may then be left suspended, so closing it and the engine connection here is what
    makes a dropped client promptly free its slot in the engine.
    """

    media_type = "text/event-stream"

    def __init__(self, content: AsyncGenerator[bytes, None], on_close: Callable[[], Awaitable[None]],
                 media_type: str | None = None):
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                         media_type=media_type)
        self._content = content
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._content.aclose()
                await self._on_close()
