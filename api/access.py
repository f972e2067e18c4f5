"""One access-log line per request on `api.access`, written when the response (or stream) ends.

The same middleware times the first token and the gaps between tokens (the engine client calls
tokens_arrived() for each Delta), and hands every finished request to an observer (metrics and
the dashboard's recent-requests table).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from contextvars import ContextVar
from typing import Protocol

import msgspec
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("api.access")

_SCOPE_KEY = "mlx_cluster_serve.access"
REQUEST_ID_HEADER = b"x-request-id"

# Control characters (C0, DEL, C1), Unicode line and paragraph separators, and the backslash itself,
# so that an escaped line reads back unambiguously and a client cannot start a line of its own.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\\]")


def escape(text: str) -> str:
    """text with what could break or forge a log line written as Python escapes (\\r, \\x1b, \\u2028)."""
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def generic_request_id() -> str:
    """The id of a request that is not a generation (those use their completion id)."""
    return f"req-{uuid.uuid4().hex}"


class Completed(msgspec.Struct, frozen=True, kw_only=True):
    """What one finished HTTP request looked like (the access line, as data)."""

    request_id: str
    time: float  # wall clock when the request arrived
    method: str
    path: str
    endpoint: str  # the route's template ("other" when none matched): bounded, for metric labels
    status: int
    prompt_tokens: int | None
    completion_tokens: int | None
    ttft: float | None
    duration: float
    outcome: str | None


class Observer(Protocol):
    def tokens(self, count: int, gap: float | None) -> None:
        """count tokens arrived; gap is the time per token since the previous ones (None for the first)."""

    def finished(self, done: Completed) -> None:
        """A request ended (its last byte is sent)."""


class AccessRecord:
    """What the handlers learn about a request; the middleware logs it."""

    __slots__ = ("request_id", "prompt_tokens", "completion_tokens", "outcome", "start", "first_token",
                 "last_token", "observer")

    def __init__(self, observer: Observer | None = None) -> None:
        self.request_id = "-"
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        # set when a stream ends other than normally: an error code or "client_disconnected"
        self.outcome: str | None = None
        self.start = time.perf_counter()
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.observer = observer

    def tokens(self, count: int) -> None:
        now = time.perf_counter()
        gap = None if self.last_token is None else (now - self.last_token) / count
        if self.first_token is None:
            self.first_token = now
        self.last_token = now
        if self.observer is not None:
            self.observer.tokens(count, gap)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start


_current: ContextVar[AccessRecord | None] = ContextVar("mlx_cluster_serve_access", default=None)


def access_record(request: Request) -> AccessRecord:
    """This request's record (a throwaway one when the middleware is not installed)."""
    return request.scope.setdefault(_SCOPE_KEY, AccessRecord())


def tokens_arrived(count: int) -> None:
    """count generated tokens reached the API for the current request (TTFT, inter-token latency)."""
    record = _current.get()
    if record is not None and count > 0:
        record.tokens(count)


def endpoint_label(scope: Scope) -> str:
    """The matched route's template with its mount prefix, e.g. /v1/models/{model_id}."""
    route = scope.get("route")
    if not isinstance(route, Route):
        return "other"
    prefix = scope["root_path"][len(scope["app_root_path"]):] if "app_root_path" in scope else ""
    return prefix + route.path_format


class AccessLog:
    """Pure ASGI middleware: measures until the last byte, so streams are logged with their tokens."""

    def __init__(self, app: ASGIApp, observer: Observer | None = None) -> None:
        self.app = app
        self.observer = observer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = scope[_SCOPE_KEY] = AccessRecord(self.observer)
        record.request_id = generic_request_id()  # a generation replaces it with its completion id
        arrived = time.time()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), request_id_header(record)]}
            await send(message)

        token = _current.set(record)
        try:
            await self.app(scope, receive, send_status)
        finally:
            _current.reset(token)
            done = Completed(
                request_id=record.request_id,
                time=arrived,
                method=scope["method"],
                path=scope["path"],
                endpoint=endpoint_label(scope),
                status=status,
                prompt_tokens=record.prompt_tokens,
                completion_tokens=record.completion_tokens,
                ttft=record.ttft,
                duration=time.perf_counter() - record.start,
                outcome=record.outcome,
            )
            _log(done)
            if self.observer is not None:
                self.observer.finished(done)


def request_id_header(record: AccessRecord) -> tuple[bytes, bytes]:
    return REQUEST_ID_HEADER, record.request_id.encode("latin-1")


# Frequent probes stay out of the INFO log unless they fail.
_QUIET_PATHS = ("/health", "/health/detail", "/metrics", "/dashboard/state")


def _log(d: Completed) -> None:
    level = logging.DEBUG if d.path in _QUIET_PATHS and d.status == 200 else logging.INFO
    if logger.isEnabledFor(level):
        logger.log(
            level,
            "%s %s %s %d prompt_tokens=%s completion_tokens=%s ttft=%s duration=%.3fs%s",
            d.request_id,
            escape(d.method),
            escape(d.path),
            d.status,
            "-" if d.prompt_tokens is None else d.prompt_tokens,
            "-" if d.completion_tokens is None else d.completion_tokens,
            "-" if d.ttft is None else f"{d.ttft:.3f}s",
            d.duration,
            f" outcome={escape(d.outcome)}" if d.outcome else "",
        )
