"""The HTTP edge of a real API process: slow or idle clients are closed, open connections are capped.

No engine is needed: everything here happens before a request reaches it.
"""

from __future__ import annotations

import contextlib
import json
import socket

import httpx
import pytest

from tests.harness import Stack, wait_for

REQUEST = b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n"


@pytest.fixture(scope="module")
def api():
    s = Stack(extra={"HTTP_HEADER_TIMEOUT": "1", "HTTP_KEEP_ALIVE_TIMEOUT": "1", "MAX_CONNECTIONS": "6"})
    proc = s.start_api()
    yield s
    proc.stop()


def connect(s: Stack) -> socket.socket:
    return socket.create_connection(("127.0.0.1", s.api_port), timeout=15)


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (bounded by the socket timeout)."""
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def test_a_connection_that_never_sends_is_closed(api):
    with connect(api) as sock:
        assert read_until_closed(sock) == b""


def test_headers_sent_too_slowly_get_408_and_the_connection_is_closed(api):
    with connect(api) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\n")  # and never the rest
        reply = read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 408 ")
    error = json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]
    assert "HTTP_HEADER_TIMEOUT=1 s" in error["message"] and error["code"] == "request_timeout"


@pytest.mark.parametrize(("path", "shape"), [
    ("/v1/messages", lambda body: body["type"] == "error" and body["error"]["type"] == "invalid_request_error"),
    ("/api/chat", lambda body: list(body) == ["error"] and "HTTP_HEADER_TIMEOUT" in body["error"]),
])
def test_the_408_of_slow_headers_takes_the_shape_of_the_requests_dialect(api, path, shape):
    with connect(api) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: test\r\n".encode())  # and never the rest
        reply = read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 408 ") and shape(json.loads(reply.split(b"\r\n\r\n", 1)[1]))


def test_an_idle_kept_alive_connection_is_closed(api):
    with connect(api) as sock:
        sock.sendall(REQUEST)
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += sock.recv(65536)
        assert reply.startswith(b"HTTP/1.1 503 ")  # /health without an engine
        read_until_closed(sock)  # the rest of the body, then the close


def test_a_kept_alive_connection_that_trickles_its_next_request_is_closed(api):
    with connect(api) as sock:
        sock.sendall(REQUEST)
        assert sock.recv(65536).startswith(b"HTTP/1.1 ")
        sock.sendall(b"GET /health HTTP/1.1\r\n")  # the next request, never finished
        assert b"HTTP/1.1 408 " in read_until_closed(sock)


def read_response(sock: socket.socket) -> bytes:
    """One whole response with a content-length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a whole response: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"closed inside the body: {data!r}"
        body += chunk
    assert len(body) == length, "more than one response"
    return head + b"\r\n\r\n" + body


def refused_before_its_body(sock: socket.socket) -> bytes:
    """Send a request with the first 1000 bytes of its body to a route that answers 404 at once; the rest."""
    body = b'{"x": "' + b"y" * 200_000 + b'"}'
    sock.sendall(b"POST /v1/nope HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body[:1000])
    assert read_response(sock).startswith(b"HTTP/1.1 404 ")
    return body[1000:]


def test_the_rest_of_a_refused_request_s_body_is_not_taken_for_a_new_request(api):
    """A request refused before its body was read (here a 404) gets one answer. The body bytes that follow
    belong to it: they get no 408 for 'headers too slow' of a request the client never began."""
    with connect(api) as sock:
        rest = refused_before_its_body(sock)
        sock.sendall(rest)
        assert read_until_closed(sock) == b""  # idle, then closed without another word


def test_after_a_refused_request_s_body_the_connection_serves_the_next_request(api):
    with connect(api) as sock:
        rest = refused_before_its_body(sock)
        sock.sendall(rest + REQUEST)  # the rest of the body and the next request in one write
        assert read_response(sock).startswith(b"HTTP/1.1 503 ")  # /health without an engine
        sock.sendall(b"GET /health HTTP/1.1\r\n")  # a third request, never finished: its headers are timed
        assert read_until_closed(sock).startswith(b"HTTP/1.1 408 ")


def too_many_connections(s: Stack) -> bool:
    """True when a new connection is refused for the cap (not merely answered 503 by /health)."""
    with connect(s) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        return b"too_many_connections" in read_until_closed(sock)


def test_connections_past_the_cap_are_refused_with_503_and_served_again_once_freed():
    s = Stack(extra={"MAX_CONNECTIONS": "3", "HTTP_HEADER_TIMEOUT": "60"})
    proc = s.start_api()
    try:
        with contextlib.ExitStack() as stack:
            for _ in range(3):
                stack.enter_context(connect(s)).sendall(b"GET /health HTTP/1.1\r\n")  # headers never finished
            wait_for(lambda: too_many_connections(s), 10, "a fourth connection to be refused")
            with connect(s) as extra:
                reply = read_until_closed(extra)
            assert reply.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in reply.lower()
            error = json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]
            assert error["code"] == "too_many_connections" and "MAX_CONNECTIONS=3" in error["message"]
            # a request that says where it goes gets its dialect's error (Anthropic's here)
            with connect(s) as extra:
                extra.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: test\r\n")
                reply = read_until_closed(extra)
            assert reply.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in reply.lower()
            body = json.loads(reply.split(b"\r\n\r\n", 1)[1])
            assert body["type"] == "error" and body["error"]["type"] == "overloaded_error"
            assert "MAX_CONNECTIONS=3" in body["error"]["message"]
        # Once the clients close theirs, the API serves again.
        wait_for(lambda: not too_many_connections(s), 10, "the API to accept connections again")
        assert httpx.get(s.base_url + "/health", timeout=10).status_code == 503  # no engine: 503, yet served
    finally:
        proc.stop()
