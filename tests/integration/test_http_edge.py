"""The HTTP edge over a real socket: hostile bodies get 4xx and keep the connection, the log cannot
be forged, POST needs JSON (and real clients send it), CORS is off unless configured, x-request-id."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess

import httpx
import pytest

from tests.harness import Stack, wait_for

CHAT = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
JSON = {"Content-Type": "application/json"}


def api_log(stack: Stack) -> str:
    return stack.procs["api"].log.read_text(errors="replace")


@pytest.mark.parametrize("body", [
    {**CHAT, "seed": 2**64},
    {**CHAT, "logit_bias": {str(2**64): 1}},
    {"model": "default", "prompt": [1, 2**64], "max_tokens": 4},
])
def test_integers_beyond_64_bits_are_400_and_the_connection_stays_open(stack, body):
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    conn = http.client.HTTPConnection("127.0.0.1", stack.api_port, timeout=30)
    try:
        conn.request("POST", path, json.dumps(body), JSON)
        r = conn.getresponse()
        error = json.loads(r.read())["error"]
        assert r.status == 400, error
        assert error["param"] in ("seed", "logit_bias", "prompt")
        first = conn.sock
        conn.request("POST", "/v1/chat/completions", json.dumps(CHAT), JSON)
        r = conn.getresponse()
        assert r.status == 200, r.read()
        r.read()
        assert conn.sock is first  # the same keep-alive connection answered both
    finally:
        conn.close()


@pytest.mark.parametrize("body", [
    json.dumps({**CHAT, "user": "@"}).encode().replace(b"@", b"\xff"),
    json.dumps(CHAT)[:-1].encode() + b', "audio": ' + b"[" * 3000 + b"]" * 3000 + b"}",
])
def test_bodies_that_do_not_decode_are_400(stack, body):
    r = httpx.post(stack.base_url + "/v1/chat/completions", content=body, headers=JSON, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_a_crlf_in_the_path_cannot_forge_a_log_line(stack):
    forged = "FORGED-LINE 2026-01-01 00:00:00,000 INFO    api.access: chatcmpl-x POST /v1/chat/completions 200"
    r = httpx.get(stack.base_url + "/v1/models%0d%0a" + forged.replace(" ", "%20"), timeout=10)
    assert r.status_code == 404
    request_id = r.headers["x-request-id"]
    line = wait_for(lambda: next((ln for ln in api_log(stack).splitlines() if request_id in ln), None), 10,
                    "the access line")
    assert "\\r\\nFORGED-LINE" in line
    assert not any(ln.startswith("FORGED-LINE") for ln in api_log(stack).splitlines())


def test_a_post_that_is_not_json_is_415(stack):
    r = httpx.post(stack.base_url + "/v1/chat/completions", content=json.dumps(CHAT),
                   headers={"Content-Type": "text/plain"}, timeout=30)
    assert r.status_code == 415
    assert "Content-Type: application/json" in r.json()["error"]["message"]


def test_the_openai_sdk_works_and_sees_the_request_id(client):
    raw = client.chat.completions.with_raw_response.create(model="default", messages=CHAT["messages"], max_tokens=4)
    assert raw.headers["x-request-id"] == raw.parse().id
    stream = client.completions.create(model="default", prompt="hi", max_tokens=4, stream=True)
    assert [c.id for c in stream]


def test_langchain_works(stack):
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(base_url=stack.base_url + "/v1", api_key="unused", model="default",
                                      max_tokens=4, max_retries=0, timeout=60)
    assert llm.invoke("hi").response_metadata["finish_reason"] in ("stop", "length")


def test_curl_with_the_json_header_works(stack):
    out = subprocess.run(
        ["curl", "-sS", "--max-time", "60", "-D", "-", stack.base_url + "/v1/chat/completions",
         "-H", "Content-Type: application/json", "-d", json.dumps(CHAT)],
        capture_output=True, timeout=90, check=True).stdout
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), out
    assert f"x-request-id: {json.loads(body)['id']}".encode() in head.lower()


def test_the_access_line_names_the_request_id_the_client_got(stack):
    r = httpx.post(stack.base_url + "/v1/chat/completions", json=CHAT, timeout=60)
    assert r.headers["x-request-id"] == r.json()["id"]
    wait_for(lambda: f"{r.json()['id']} POST /v1/chat/completions 200" in api_log(stack), 10, "the access line")


def test_cors_is_off_by_default(stack):
    r = httpx.options(stack.base_url + "/v1/chat/completions", timeout=10, headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert r.status_code == 405
    assert "access-control-allow-origin" not in r.headers


@pytest.fixture(scope="module")
def edge_api(stack):
    """A second API on the session's engine with CORS on and a short body deadline."""
    s = Stack(root=stack.root, extra={"CORS_ORIGINS": "http://localhost:5173", "BODY_READ_TIMEOUT": "1"})
    api = s.start_api()
    yield s
    api.stop()


def test_cors_origins_enable_cors_for_those_origins(edge_api):
    r = httpx.options(edge_api.base_url + "/v1/chat/completions", timeout=10, headers={
        "Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "http://localhost:5173"
    r = httpx.post(edge_api.base_url + "/v1/chat/completions", json=CHAT, timeout=60,
                   headers={"Origin": "http://localhost:5173"})
    assert r.headers["access-control-allow-origin"] == "http://localhost:5173"


def test_a_body_that_stops_arriving_is_408_and_the_connection_closed(edge_api):
    with socket.create_connection(("127.0.0.1", edge_api.api_port), timeout=20) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"model\"")
        received = b""
        while chunk := sock.recv(65536):  # the server closes after its answer; the timeout bounds the wait
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), received
    assert json.loads(body)["error"]["code"] == "request_timeout"
