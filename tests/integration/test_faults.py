"""Faults with one real rank: the API or the engine killed mid-stream, and hostile socket frames.

Client disconnects are covered by test_batching.py (twenty streams, half dropped) and
test_engine_lifecycle.py (one stream dropped); a non-streaming client that gives up is here.
Rank faults (two ranks, launch.sh, the supervisor) are in tests/multirank/test_rank_faults.py.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import signal
import socket
import stat
import time

import httpx
import pytest

from ipc import PROTOCOL_VERSION, Error, Hello, InfoRequest, Welcome
from ipc.framing import HEADER, encode_frame
from tests.harness import Stack, wait_for
from tests.wire import deeply_nested_generate, frames

MESSAGES = [{"role": "user", "content": "hello"}]
# EOS and pad banned: the demo model then generates until max_tokens
LONG = {"max_tokens": 4000, "logit_bias": {"0": -100, "2": -100}}


def active(s: Stack) -> int | None:
    info = s.probe()
    return None if info is None else info["active"]


@contextlib.contextmanager
def open_streams(s: Stack, n: int):
    """n long streaming requests, each past its first chunk; yields their line iterators."""
    with contextlib.ExitStack() as stack:
        http = stack.enter_context(httpx.Client(timeout=httpx.Timeout(10, read=10)))
        lines = []
        for i in range(n):
            if i % 2:
                body = {"model": "default", "prompt": f"story {i}", "stream": True, **LONG}
                r = stack.enter_context(http.stream("POST", s.base_url + "/v1/completions", json=body))
            else:
                body = {"model": "default", "messages": MESSAGES, "stream": True, **LONG}
                r = stack.enter_context(http.stream("POST", s.base_url + "/v1/chat/completions", json=body))
            assert r.status_code == 200
            it = r.iter_lines()
            assert next(it).startswith("data: ")
            lines.append(it)
        yield lines


def test_api_killed_mid_stream_frees_every_sequence_and_a_new_api_serves_at_once(own_stack):
    s = own_stack
    engine_pid = s.probe()["engine_pid"]
    with open_streams(s, 4):
        wait_for(lambda: active(s) == 4, 10, "four running sequences")
        s.procs["api"].signal(signal.SIGKILL)
        s.procs["api"].popen.wait(10)
        # The kernel closed the dead API's sockets; the engine must notice each one.
        wait_for(lambda: active(s) == 0, 10, "the engine to free the dead API's sequences")

    t0 = time.monotonic()
    s.procs["api"] = s.start_api()
    r = httpx.post(s.base_url + "/v1/chat/completions", timeout=30,
                   json={"model": "default", "messages": MESSAGES, "max_tokens": 4})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0
    assert time.monotonic() - t0 < 15  # no weights reloaded: only the small API restarted
    assert s.probe()["engine_pid"] == engine_pid
    assert httpx.get(s.base_url + "/health", timeout=10).json()["engine_pid"] == engine_pid

    # A non-streaming client that gives up mid-request frees its sequence too.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(s.base_url + "/v1/completions", timeout=httpx.Timeout(10, read=1.0),
                   json={"model": "default", "prompt": "a long one", **LONG})
    wait_for(lambda: active(s) == 0, 10, "the abandoned non-streaming request to be freed")


def test_engine_killed_ends_open_streams_within_2s_then_503_until_it_returns(own_stack):
    s = own_stack
    with open_streams(s, 3) as streams, cf.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(httpx.post, s.base_url + "/v1/chat/completions", timeout=30,
                              json={"model": "default", "messages": MESSAGES, **LONG})
        wait_for(lambda: active(s) == 4, 10, "four running requests")
        s.procs["engine"].signal(signal.SIGKILL)
        killed = time.monotonic()
        for it in streams:
            rest = [line for line in it if line]
            assert time.monotonic() - killed < 2.0
            assert rest[-1] == "data: [DONE]"
            error = json.loads(rest[-2].removeprefix("data: "))["error"]
            assert error["code"] == "engine_unavailable" and error["message"]
        r = waiting.result(timeout=5)
        assert time.monotonic() - killed < 2.0
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"

    r = httpx.post(s.base_url + "/v1/completions", timeout=10, json={"model": "default", "prompt": "hi"})
    assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
    assert r.json()["error"]["type"] == "server_error"

    # SIGKILL left the socket file behind; a new engine replaces it and the API reconnects by itself.
    s.procs["engine"].popen.wait(10)
    assert s.socket.exists()
    s.procs["engine"] = s.start_engine()
    wait_for(lambda: httpx.get(s.base_url + "/health", timeout=10).status_code == 200, 30, "/health 200")
    r = httpx.post(s.base_url + "/v1/completions", timeout=30, json={"model": "default", "prompt": "hi",
                                                                      "max_tokens": 3})
    assert r.status_code == 200


# ---- hostile frames on the engine socket (the shared engine of this session)

MAX_FRAME = 32 * 1024 * 1024  # the default MAX_FRAME_BYTES the session's engine runs with
HELLO = encode_frame(Hello(version=PROTOCOL_VERSION, client="hostile"))
NESTED = deeply_nested_generate(200_000)


def exchange(path, data: bytes, *, half_close: bool = True, timeout: float = 15.0) -> list:
    """Send raw bytes; every frame the engine answers until it closes the connection."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return frames(received)


ATTACKS = {
    "garbage handshake": (HEADER.pack(3) + b"\xc1\xc1\xc1", "bad_frame"),
    "wrong version": (encode_frame(Hello(version=PROTOCOL_VERSION + 7)), "protocol_version_mismatch"),
    "oversized handshake": (HEADER.pack(MAX_FRAME + 1), "bad_frame"),
    "truncated handshake": (HEADER.pack(100) + b"x" * 10, "bad_frame"),
    "garbage request": (HELLO + HEADER.pack(4) + b"\xc1\xc1\xc1\xc1", "bad_frame"),
    "oversized request": (HELLO + HEADER.pack(2**32 - 1), "bad_frame"),
    "truncated request": (HELLO + HEADER.pack(50) + encode_frame(InfoRequest())[:8], "bad_frame"),
    "unexpected message": (HELLO + encode_frame(Welcome(version=PROTOCOL_VERSION)), "bad_frame"),
    "deeply nested request": (HELLO + HEADER.pack(len(NESTED)) + NESTED, "bad_frame"),
}
# Sent without closing our side: the engine gives up after its 5 s handshake timeout.
STALLS = {
    "silent client": (b"", "bad_frame"),
    "stalled handshake": (HEADER.pack(100) + b"x", "bad_frame"),
    "stalled request": (HELLO + HEADER.pack(100) + b"x", "bad_frame"),
}


def test_hostile_frames_get_an_error_frame_and_the_engine_keeps_serving(stack):
    assert stat.S_IMODE(stack.socket.stat().st_mode) == 0o600
    body = {"model": "default", "prompt": "keep going", "max_tokens": 200, "stream": True,
            "logit_bias": {"0": -100, "2": -100}}
    with httpx.Client(timeout=30) as http, http.stream("POST", stack.base_url + "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        with cf.ThreadPoolExecutor(len(STALLS)) as pool:
            stalls = {name: pool.submit(exchange, stack.socket, data, half_close=False)
                      for name, (data, _) in STALLS.items()}
            for name, (data, code) in ATTACKS.items():
                replies = exchange(stack.socket, data)
                expect_welcome = data.startswith(HELLO)
                assert len(replies) == 1 + expect_welcome, (name, replies)
                if expect_welcome:
                    assert isinstance(replies[0], Welcome), name
                assert isinstance(replies[-1], Error) and replies[-1].code == code, (name, replies[-1])
            for name, future in stalls.items():
                replies = future.result(timeout=20)
                assert isinstance(replies[-1], Error) and replies[-1].code == STALLS[name][1], (name, replies)
        # The stream that was running all along is intact and finishes normally.
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    assert not any('"error"' in line for line in rest)
    chunks = [json.loads(line[6:]) for line in rest[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert stack.probe() is not None
