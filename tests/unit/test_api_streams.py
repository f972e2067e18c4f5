"""How a generation ends badly (engine death, timeout, client disconnect); the access log; the entry point."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

import ipc
from api import create_app
from ipc.framing import encode_frame

CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "Hi"}]}
REPO = Path(__file__).resolve().parents[2]


async def read_events(client, body):
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        return [line.removeprefix("data: ") async for line in r.aiter_lines() if line.startswith("data: ")]


@pytest.mark.anyio
async def test_engine_dies_mid_stream_sends_error_event_then_done(engine, client):
    engine.die_after(["Hel"])
    events = await read_events(client, {**CHAT, "stream": True})
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "engine_unavailable" and error["type"] == "server_error"
    assert json.loads(events[1])["choices"][0]["delta"] == {"content": "Hel"}


@pytest.mark.anyio
async def test_request_timeout_mid_stream_sends_error_event_then_done(engine, make_client):
    engine.hold(["Hel"])
    async with make_client(REQUEST_TIMEOUT=0.2) as client:
        events = await read_events(client, {**CHAT, "stream": True})
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "timeout"
    with anyio.fail_after(5):
        await engine.peer_closed.wait()


async def drive(app, body: bytes, disconnect: anyio.Event, *, after_chunk: bytes | None = None) -> list[dict]:
    """Call the ASGI app directly (httpx's ASGITransport buffers whole responses): the client
    sends body, then disconnects once `disconnect` is set or a chunk containing after_chunk is out."""
    sent: list[dict] = []
    delivered = False

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)
        if after_chunk and message["type"] == "http.response.body" and after_chunk in message.get("body", b""):
            disconnect.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("test", 80),
    }
    await app(scope, receive, send)
    return sent


# The engine stays silent around each disconnect below: on asyncio, anyio's Unix socket receive
# logs an InvalidStateError when its cancellation and newly readable data land in the same loop
# iteration (its reader callback sets a result on the cancelled future); harmless, but the test
# runner reports it.


@pytest.mark.anyio
async def test_client_disconnect_mid_stream_closes_the_engine_connection(engine, make_settings):
    engine.hold(["Hel"])
    app = create_app(make_settings())
    with anyio.fail_after(5):
        sent = await drive(app, json.dumps({**CHAT, "stream": True}).encode(), anyio.Event(), after_chunk=b"Hel")
        await engine.peer_closed.wait()
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [200]
    assert not any(b"[DONE]" in m.get("body", b"") for m in sent)


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_client_disconnect_before_admission_closes_the_engine_connection(engine, make_settings, stream):
    engine.hold(None)
    app = create_app(make_settings())
    disconnect = anyio.Event()
    sent: list[dict] = []

    async def client() -> None:
        sent.extend(await drive(app, json.dumps({**CHAT, "stream": stream}).encode(), disconnect))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(client)
            await engine.received.wait()
            disconnect.set()
            await engine.peer_closed.wait()
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [499]


@pytest.mark.anyio
async def test_access_log_line(engine, client, caplog):
    caplog.set_level(logging.INFO, logger="api.access")
    r = await client.post("/v1/chat/completions", json=CHAT)
    (record,) = [rec for rec in caplog.records if rec.name == "api.access"]
    line = record.getMessage()
    assert record.levelno == logging.INFO
    assert line.startswith(f"{r.json()['id']} POST /v1/chat/completions 200 prompt_tokens=7 completion_tokens=2 ")
    assert "Hi" not in line  # prompts only at DEBUG


def test_entry_point_imports_no_mlx():
    # test_boundaries.py covers every api submodule but __main__
    code = (
        "import sys, api.__main__\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm', 'transformers', 'engine'))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.anyio
async def test_events_that_arrive_together_leave_in_one_write_and_nothing_is_lost(engine, make_settings):
    """A client that reads slower than tokens come: the engine's frames pile up, and the stream sends what
    has piled up in one write instead of one write per token, every token still in order."""
    pieces = [f"t{i} " for i in range(60)]

    async def script(conn: ipc.FramedStream, msg: ipc.Generate) -> None:
        rid = msg.request_id
        await conn.send(ipc.Started(request_id=rid, prompt_tokens=7))
        frames = [ipc.Delta(request_id=rid, text=p, completion_tokens=i) for i, p in enumerate(pieces, 1)]
        frames.append(ipc.Finish(request_id=rid, finish_reason="length", prompt_tokens=7,
                                 completion_tokens=len(pieces)))
        await conn.stream.send(b"".join(encode_frame(f) for f in frames))  # all at once: the reader is behind
        try:
            await conn.recv()
        except ipc.ConnectionClosed:
            pass

    engine.script = script
    app = create_app(make_settings())
    with anyio.fail_after(10):
        sent = await drive(app, json.dumps({**CHAT, "stream": True}).encode(), anyio.Event())
    bodies = [m["body"] for m in sent if m["type"] == "http.response.body" and m.get("body")]
    events = [line.removeprefix(b"data: ") for body in bodies for line in body.split(b"\n\n") if line]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "".join(pieces)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    writes_with_text = [b for b in bodies if b"t1 " in b or b"t59 " in b]
    assert len(bodies) <= 4 and len(writes_with_text) == 1, [len(b) for b in bodies]
