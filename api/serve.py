"""The HTTP server around the app: slow-client limits, a shared listening port, a bounded drain.

uvicorn closes a kept-alive connection that stays idle, but not one that never completes its
request headers, and it caps requests rather than open connections; `EdgeProtocol` adds both.
`listen()` binds with SO_REUSEPORT so a new API can start on the port of the one it replaces
(`launch.sh restart-api`); `DrainingServer` lets the old one finish its streams, then ends the
ones still open with an error event and `[DONE]`. While it drains, a request that reaches it on a
kept-alive connection is answered with `Connection: close`: only an idle connection's keep-alive
timeout closes one unasked, and never with a request already waiting in its socket.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import socket
from pathlib import Path

import h11
import uvicorn
from uvicorn.protocols.http.flow_control import CLOSE_HEADER
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

from api.bodies import encode
from api.dialects import error_body
from api.errors import APIError, RequestTimeout, TooManyConnections
from api.generation import end_open_streams
from config import Settings
from ipc import ignore_settled_wakeups

log = logging.getLogger(__name__)

# Seconds the ended streams get to send their error event and [DONE] before they are cut.
FLUSH_SECONDS = 5.0
LINGER_SECONDS = 1.0  # a refused connection is read (and discarded) this long before it is closed
HEAD_BYTES = 2048  # of a request's start, kept until its headers are complete: its request line names the dialect


def _response(status: bytes, err: APIError, start: bytes) -> bytes:
    """A whole HTTP/1.1 response that closes the connection, written before any request was parsed: its error
    in the dialect of the path in the request line that starts `start` (OpenAI's without one)."""
    line = start.split(b"\n", 1)[0].split(b" ")
    body = encode(error_body(err, line[1].decode("latin-1") if len(line) > 1 else ""))
    extra = [f"{k.lower()}: {v}".encode() for k, v in err.headers.items() if k.lower() != "connection"]
    head = [b"HTTP/1.1 " + status, b"content-type: application/json", *extra, b"connection: close",
            b"content-length: %d" % len(body)]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class EdgeProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for request headers and a cap on open connections;
    edge_protocol() makes one configured with the settings."""

    header_timeout = 10.0
    max_connections = 512
    too_slow: APIError = RequestTimeout("")  # the 408's error
    too_many: APIError = TooManyConnections("")  # the 503's error
    _head = b""  # the first bytes of the request whose headers are awaited
    _answered = False
    _header_timer: asyncio.TimerHandle | None = None
    _waiting_cycle: object = None
    _got_bytes = False
    _refused = False
    _leftover = False  # the header timer runs for the rest of a body whose request was answered already
    _draining = False  # the server stops: every response from now on closes its connection

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            # Refused before it can hold anything: no request parsed, no task started. It is answered
            # when its request line comes (or after a moment without one).
            self._waiting_cycle = False
            self._refused = True
            self.loop.call_later(LINGER_SECONDS, self._refuse)
            return
        self._arm()

    def _refuse(self) -> None:
        """The 503; the close lingers a moment, reading what the client still sends, so it gets it, not a reset."""
        if self._answered or self.transport.is_closing():
            return
        self._answered = True
        self.transport.write(_response(b"503 Service Unavailable", self.too_many, self._head))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, self.transport.close)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            self._head = (self._head + data)[:HEAD_BYTES]
            if b"\n" in self._head or len(self._head) >= HEAD_BYTES:
                self._refuse()
            return
        if self._waiting_cycle is not False:
            # The rest of a body whose request was answered before it was read (a 404, a 413) is no new
            # request: the connection gets the header deadline to finish it, and a silent close if it does not.
            leftover = self.conn.their_state is h11.SEND_BODY
            if self._header_timer is None or (self._leftover and not leftover):
                # A kept-alive connection's next request: its headers are timed from the first byte.
                self._arm()
            self._leftover = leftover
            self._got_bytes = self._got_bytes or not leftover
            if not leftover and len(self._head) < HEAD_BYTES:
                self._head += data[:HEAD_BYTES - len(self._head)]
        super().data_received(data)
        if self._waiting_cycle is not False and self.cycle is not self._waiting_cycle:
            self._headers_done()
        elif self._leftover and self.conn.their_state is not h11.SEND_BODY and self.conn.trailing_data[0]:
            # the old body ended inside this read and the next request began after it
            self._leftover, self._got_bytes = False, True
            self._arm()

    def on_response_complete(self) -> None:
        finished = self.cycle
        super().on_response_complete()  # may parse a pipelined request into a new cycle
        if not self.transport.is_closing():
            # Idle until the next request's first byte: uvicorn's keep-alive timeout applies.
            self._waiting_cycle, self._got_bytes = finished, False
            if self.cycle is not finished:
                self._headers_done()

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_done()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self._draining:
            _close_after(self.cycle)

    def shutdown(self) -> None:
        """The server drains. uvicorn would close an idle kept-alive connection here, resetting a request the
        client may be sending on it that very moment: it stays open instead, its next request is answered with
        Connection: close, and its keep-alive timeout closes it if none comes. A response under way whose
        headers are not sent yet says Connection: close too; one already streaming keeps its connection, whose
        next request is answered and closes it."""
        self._draining = True
        if not self._refused:
            _close_after(self.cycle)

    def timeout_keep_alive_handler(self) -> None:
        if self._unread():  # the next request arrived as the connection expired: it is read and answered
            self.timeout_keep_alive_task = None
            return
        super().timeout_keep_alive_handler()

    def _unread(self) -> bool:
        """Bytes (or the client's close) wait in the socket unread: closing it now would reset them."""
        sock = self.transport.get_extra_info("socket")
        if sock is None or self.transport.is_closing():
            return False
        poller = select.poll()  # not select.select: a descriptor may be above FD_SETSIZE
        poller.register(sock.fileno(), select.POLLIN)
        return bool(poller.poll(0))

    def _arm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _headers_done(self) -> None:
        self._waiting_cycle = False
        self._leftover = False
        self._head = b""
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self._got_bytes:
            self.transport.write(_response(b"408 Request Timeout", self.too_slow, self._head))
        elif self._unread():  # the first byte arrived just now: its request gets the whole deadline
            return
        self.transport.close()


def _close_after(cycle: RequestResponseCycle | None) -> None:
    """cycle's response, not begun yet, says Connection: close and its connection closes after it (uvicorn
    adds the header when the request carries it), so its client sends nothing more on it."""
    if cycle is not None and not cycle.response_started and CLOSE_HEADER not in cycle.scope["headers"]:
        cycle.scope["headers"].append(CLOSE_HEADER)


def edge_protocol(header_timeout: float, max_connections: int) -> type[H11Protocol]:
    """EdgeProtocol with these limits and the errors it answers with when they are reached."""
    too_slow = RequestTimeout(f"the request headers did not arrive within HTTP_HEADER_TIMEOUT={header_timeout:g} s")
    too_many = TooManyConnections(
        f"the server has too many open connections (MAX_CONNECTIONS={max_connections}); retry shortly")
    return type("EdgeProtocol", (EdgeProtocol,), {"header_timeout": header_timeout, "max_connections": max_connections,
                                                  "too_slow": too_slow, "too_many": too_many})


def listen(host: str, port: int, *, take_over: bool) -> socket.socket:
    """A listening-ready socket on host:port that a successor may bind too (SO_REUSEPORT).

    Without take_over, a port some process already holds is an error (EADDRINUSE), as with a
    plain bind: only a deliberate restart shares the port with the API it replaces.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if not take_over:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "SO_REUSEPORT"):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class DrainingServer(uvicorn.Server):
    """On TERM: stop accepting, let open streams run for drain_seconds, then end them cleanly."""

    def __init__(self, config: uvicorn.Config, *, drain_seconds: float, ready_file: Path | None = None):
        super().__init__(config)
        self.drain_seconds = drain_seconds
        self.ready_file = ready_file

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        ignore_settled_wakeups(asyncio.get_running_loop())
        await super().startup(sockets=sockets)
        if self.started and self.ready_file is not None:
            # Tells launch.sh this process listens now (its /health may be answered by the old API).
            tmp = self.ready_file.with_name(f".{self.ready_file.name}.tmp")
            tmp.write_text(f"{os.getpid()}\n")
            os.replace(tmp, self.ready_file)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        timer = asyncio.get_running_loop().call_later(self.drain_seconds, self._drain_deadline)
        try:
            await super().shutdown(sockets=sockets)
        finally:
            timer.cancel()
            if self.ready_file is not None:
                self.ready_file.unlink(missing_ok=True)

    def _drain_deadline(self) -> None:
        ended = end_open_streams(f"the API server is restarting or stopping (API_DRAIN_TIMEOUT="
                                 f"{self.drain_seconds:g} s passed); retry the request")
        if ended:
            log.warning("ended %d open request(s) still running after API_DRAIN_TIMEOUT=%g s", ended,
                        self.drain_seconds)


def server(app, settings: Settings, *, ready_file: Path | None = None) -> DrainingServer:
    config = uvicorn.Config(
        app,
        http=edge_protocol(settings.HTTP_HEADER_TIMEOUT, settings.MAX_CONNECTIONS),
        log_config=None,
        log_level=settings.LOG_LEVEL.lower(),
        access_log=False,  # api.access logs one line per request, with tokens
        lifespan="off",
        timeout_keep_alive=settings.HTTP_KEEP_ALIVE_TIMEOUT,  # type: ignore[arg-type]  # call_later takes a float
        timeout_graceful_shutdown=settings.API_DRAIN_TIMEOUT + FLUSH_SECONDS,  # type: ignore[arg-type]
    )
    return DrainingServer(config, drain_seconds=settings.API_DRAIN_TIMEOUT, ready_file=ready_file)
