"""Engine down and back, and client disconnects, with a real engine and API of their own."""

from __future__ import annotations

import time

import httpx
import openai

from tests.harness import wait_for

MESSAGES = [{"role": "user", "content": "hello"}]


def test_engine_down_gives_503_then_the_api_reconnects(own_stack):
    s = own_stack
    client = openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0, timeout=30)
    s.closers = [client]
    assert client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=4).usage.completion_tokens

    s.procs["engine"].stop()
    r = httpx.post(s.base_url + "/v1/chat/completions", timeout=10,
                   json={"model": "default", "messages": MESSAGES, "max_tokens": 4})
    assert r.status_code == 503
    assert "Retry-After" in r.headers
    assert r.json()["error"]["message"]
    assert httpx.get(s.base_url + "/health", timeout=10).status_code == 503

    s.procs["engine"] = s.start_engine()
    wait_for(lambda: httpx.get(s.base_url + "/health", timeout=10).status_code == 200, 30, "health back to 200")
    r = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=4)
    assert r.usage.completion_tokens > 0


def test_client_disconnect_mid_stream_frees_the_slot(own_stack):
    s = own_stack
    body = {"model": "default", "messages": MESSAGES, "max_tokens": 4000, "stream": True,
            "logit_bias": {str(t): -100 for t in (0, 2)}}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", s.base_url + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]
            assert any(line.startswith("data: ") for line in got)
            assert s.probe()["active"] == 1
    # leaving the block closed the connection mid-stream
    wait_for(lambda: s.probe()["active"] == 0, 10, "the engine to drop the disconnected request")
    r = httpx.post(s.base_url + "/v1/completions", timeout=30,
                   json={"model": "default", "prompt": "hi", "max_tokens": 3})
    assert r.status_code == 200


def test_engine_killed_mid_stream_ends_the_stream_with_an_error_event(own_stack):
    s = own_stack
    body = {"model": "default", "messages": MESSAGES, "max_tokens": 4000, "stream": True,
            "logit_bias": {str(t): -100 for t in (0, 2)}}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", s.base_url + "/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()
            next(lines)
            s.procs["engine"].signal(9)
            start = time.monotonic()
            rest = [line for line in lines if line]
            assert time.monotonic() - start < 5
    assert rest[-1] == "data: [DONE]"
    assert any('"error"' in line for line in rest[-3:])
