"""bench/clients.py's HTTP client against a local server that answers with fixed bytes: the response
framings both servers under test use (chunked from uvicorn, close-delimited or sized from
mlx_lm.server's http.server), errors, and what a broken response leaves in the sample."""

from __future__ import annotations

import asyncio
import json

from bench import clients

REQUEST = clients.chat("hello", 3, {}, "m")


def sse(*objs: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs) + b"data: [DONE]\n\n"


STREAM = sse({"choices": [{"delta": {"role": "assistant"}}]},
             {"choices": [{"delta": {"content": "a"}}]},
             {"choices": [{"delta": {"content": "b"}}]},
             {"choices": [{"delta": {"content": "c"}}]},
             {"choices": [], "usage": {"completion_tokens": 3}})


def chunked(body: bytes, size: int) -> bytes:
    """body in chunks of `size` bytes (split across SSE lines, as TCP may deliver them)."""
    parts = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def serve_once(responses: list[bytes]) -> tuple[list[bytes], clients.Sample]:
    """Answer each connection with the next response (then close); returns the requests and the sample."""
    seen: list[bytes] = []

    async def main() -> clients.Sample:
        queue = list(responses)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int([h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")][0].split(b":")[1])
            seen.append(head + await reader.readexactly(length))
            writer.write(queue.pop(0))
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await asyncio.wait_for(clients.stream_one(clients.Client(), f"http://127.0.0.1:{port}", REQUEST), 10)

    return seen, asyncio.run(main())


def test_a_chunked_stream_split_anywhere_gives_first_and_last_text_and_usage_tokens():
    for size in (1, 7, 64, 10_000):
        seen, s = serve_once([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(STREAM, size)])
        assert s.ok and s.error == "" and s.status == 200
        assert s.tokens == 3 and s.chunks == 5
        assert s.first is not None and s.last is not None and s.first <= s.last
    head, body = seen[0].split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert json.loads(body) == REQUEST.body


def test_a_close_delimited_or_sized_stream_reads_the_same():
    for response in (b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + STREAM,
                     b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(STREAM) + STREAM):
        _, s = serve_once([response])
        assert s.ok and s.tokens == 3 and s.chunks == 5


def test_an_error_status_keeps_its_code_and_message():
    body = b'{"error": {"message": "max_tokens must be at least 1"}}'
    _, s = serve_once([b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n" % len(body) + body])
    assert s.status == 400 and not s.ok
    assert s.error.startswith("HTTP 400:") and "max_tokens must be at least 1" in s.error


def test_an_error_event_inside_the_stream_ends_the_sample_with_it():
    stream = sse({"choices": [{"delta": {"content": "a"}}]}, {"error": {"message": "engine restarted"}})
    _, s = serve_once([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(stream, 16)])
    assert not s.ok and "engine restarted" in s.error


def test_a_connection_closed_before_any_response_is_retried_then_reported():
    seen, s = serve_once([b"", b"", b"garbage\r\n\r\n"])
    assert len(seen) == 1 + clients.RETRIES  # sent again, at most RETRIES times
    assert s.retries == clients.RETRIES and s.status is None
    assert "ResponseError" in s.error and "garbage" in s.error


def test_a_stream_cut_mid_chunk_is_an_error_not_a_result():
    cut = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(STREAM, 40))[:120]
    _, s = serve_once([cut])
    assert s.status == 200 and not s.ok and s.retries == 0
    assert "IncompleteReadError" in s.error


def test_a_stream_cut_between_chunks_is_an_error_too():
    whole = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(STREAM, 40)
    cut = whole[:whole.index(b"\r\n", 200) + 2]  # right after a chunk's CRLF, before the next size line
    _, s = serve_once([cut])
    assert s.status == 200 and not s.ok
    assert "closed inside a chunked body" in s.error
