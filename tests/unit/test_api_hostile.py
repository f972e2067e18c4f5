"""The HTTP edge against hostile or careless clients: every input gets a 2xx or a 4xx OpenAI error.

Out-of-range integers, bodies that are not UTF-8 or nest too deeply, a wrong Content-Type, a body
that never finishes arriving; plus what every response carries (x-request-id), CORS, the 429's
shape, and log lines that a client cannot forge.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ipc
from api import create_app
from api.openai.routes import OpenAIRoutes
from config import ConfigError, load_settings
from tests.unit.openai_errors import assert_error

pytestmark = pytest.mark.anyio

CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "Hi"}]}
COMPLETION = {"model": "test-model", "prompt": "Once"}
JSON = {"Content-Type": "application/json"}
REQUEST_ID = re.compile(r"^req-[0-9a-f]{32}$")


# ---------------------------------------------------------------- integers the wire cannot carry


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {**CHAT, "seed": 2**64}, "seed"),
        ("/v1/chat/completions", {**CHAT, "seed": 2**63}, "seed"),
        ("/v1/chat/completions", {**CHAT, "seed": -(2**63) - 1}, "seed"),
        ("/v1/completions", {**COMPLETION, "seed": 2**70}, "seed"),
        ("/v1/chat/completions", {**CHAT, "logit_bias": {str(2**64): 1}}, "logit_bias"),
        ("/v1/completions", {**COMPLETION, "logit_bias": {str(2**31): 1}}, "logit_bias"),
        ("/v1/completions", {**COMPLETION, "prompt": [1, 2**64]}, "prompt"),
        ("/v1/completions", {**COMPLETION, "prompt": [2**31]}, "prompt"),
        ("/v1/chat/completions", {**CHAT, "top_k": 2**64}, "top_k"),
    ],
)
async def test_integers_out_of_range_are_400_naming_the_param(engine, client, path, body, param):
    error = assert_error(await client.post(path, json=body), 400, param=param)
    assert param in error["message"]
    assert engine.generates == []
    assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200


@pytest.mark.parametrize("seed", [2**63 - 1, -(2**63), 0])
async def test_seeds_across_the_signed_64_bit_range_reach_the_engine(engine, client, seed):
    r = await client.post("/v1/chat/completions", json={**CHAT, "seed": seed})
    assert r.status_code == 200, r.text
    assert engine.generates[0].params.seed == seed


async def test_largest_token_id_is_accepted(engine, client):
    r = await client.post("/v1/completions", json={**COMPLETION, "prompt": [2**31 - 1], "logit_bias": {"0": 1}})
    assert r.status_code == 200, r.text
    assert engine.generates[0].prompt == [2**31 - 1]


@pytest.mark.parametrize(
    "body",
    [
        # free-form JSON (tool arguments, tool schemas) reaches the wire unchecked by the schema
        {**CHAT, "messages": [{"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"n": 2**70}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]},
        {**CHAT, "messages": [{"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": json.dumps({"n": 2**70})}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]},
        {**CHAT, "tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {"n": {"type": "integer", "maximum": 10**30}}}}}]},
    ],
)
async def test_a_message_the_engine_wire_cannot_encode_is_400(engine, client, body):
    error = assert_error(await client.post("/v1/chat/completions", json=body), 400)
    assert "cannot be sent to the engine" in error["message"]
    assert engine.generates == []


# ---------------------------------------------------------------- bodies that do not decode


async def test_a_body_that_is_not_utf8_is_400(engine, client):
    body = json.dumps({**CHAT, "user": "@"}).encode().replace(b"@", b"\xff\xfe")
    error = assert_error(await client.post("/v1/chat/completions", content=body, headers=JSON), 400)
    assert "UTF-8" in error["message"]
    assert engine.generates == []


DEEP = 5000


@pytest.mark.parametrize(
    "body",
    [
        json.dumps(CHAT)[:-1].encode() + b', "audio": ' + b"[" * DEEP + b"]" * DEEP + b"}",
        json.dumps(CHAT)[:-1].encode() + b', "tools": [{"type": "function", "function": {"name": "f", "parameters": '
        + b'{"a": ' * DEEP + b"1" + b"}" * DEEP + b"}}]}",
    ],
)
async def test_json_nested_too_deeply_is_400(engine, client, body):
    error = assert_error(await client.post("/v1/chat/completions", content=body, headers=JSON), 400)
    assert "nested too deeply" in error["message"]
    assert engine.generates == []


@pytest.mark.parametrize("body", [b"[" * DEEP + b"]" * DEEP,
                                  b'{"model": "test-model", "messages": ' + b"[" * DEEP + b"]" * DEEP + b"}"])
async def test_deep_json_where_the_schema_expects_something_else_is_400(engine, client, body):
    r = await client.post("/v1/chat/completions", content=body, headers=JSON)
    assert r.status_code == 400, r.text
    assert engine.generates == []


# ---------------------------------------------------------------- Content-Type


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/jsonx", ""])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_a_post_without_a_json_content_type_is_415(engine, client, content_type, path):
    body = json.dumps(CHAT if "chat" in path else COMPLETION).encode()
    headers = {} if content_type is None else {"Content-Type": content_type}
    error = assert_error(await client.post(path, content=body, headers=headers), 415, code="unsupported_media_type")
    assert "Content-Type: application/json" in error["message"]
    assert engine.generates == []


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8",
                                          "Application/JSON;charset=UTF-8", " application/json "])
async def test_json_content_types_with_parameters_are_accepted(engine, client, content_type):
    r = await client.post("/v1/chat/completions", content=json.dumps(CHAT).encode(),
                          headers={"Content-Type": content_type})
    assert r.status_code == 200, r.text


# ---------------------------------------------------------------- a body that never finishes


async def test_a_body_trickling_past_body_read_timeout_is_408(engine, make_client):
    stalled = anyio.Event()

    async def trickle() -> AsyncIterator[bytes]:
        yield b'{"model": "test-model", '
        await stalled.wait()  # never set: the rest of the body never comes
        yield b"}"

    async with make_client(BODY_READ_TIMEOUT=0.2) as client:
        with anyio.fail_after(10):
            r = await client.post("/v1/chat/completions", content=trickle(), headers=JSON)
    error = assert_error(r, 408, code="request_timeout")
    assert "BODY_READ_TIMEOUT" in error["message"]
    assert r.headers["connection"] == "close"
    assert engine.generates == []


# ---------------------------------------------------------------- what every response carries


async def test_generations_carry_their_completion_id_as_x_request_id(engine, client):
    r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.headers["x-request-id"] == r.json()["id"] == engine.generates[0].request_id
    r = await client.post("/v1/completions", json=COMPLETION)
    assert r.headers["x-request-id"] == r.json()["id"]
    assert r.json()["id"].startswith("cmpl-")
    async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as s:
        chunks = [json.loads(line[6:]) async for line in s.aiter_lines() if line.startswith("data: {")]
    assert {c["id"] for c in chunks} == {s.headers["x-request-id"]}


async def test_errors_of_a_generation_carry_its_id(engine, client):
    r = await client.post("/v1/chat/completions", json={**CHAT, "temperature": 9})
    assert r.status_code == 400
    assert r.headers["x-request-id"].startswith("chatcmpl-")


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/models"), ("GET", "/health"), ("GET", "/nowhere"),
                                              ("DELETE", "/v1/models"), ("GET", "/openapi.json")])
async def test_other_routes_carry_a_generated_request_id(engine, client, method, path):
    first = await client.request(method, path)
    second = await client.request(method, path)
    assert REQUEST_ID.match(first.headers["x-request-id"])
    assert first.headers["x-request-id"] != second.headers["x-request-id"]


async def test_a_bug_answers_500_with_a_request_id_too(engine, make_settings, monkeypatch):
    async def broken(self, request):
        raise RuntimeError("a bug")

    monkeypatch.setattr(OpenAIRoutes, "list_models", broken)
    transport = httpx.ASGITransport(app=create_app(make_settings()), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        r = await client.get("/v1/models")
    assert_error(r, 500)
    assert REQUEST_ID.match(r.headers["x-request-id"])


# ---------------------------------------------------------------- 429 in OpenAI's shape


@pytest.mark.parametrize("stream", [False, True])
async def test_a_full_queue_is_openais_rate_limit_error(engine, client, stream):
    engine.refuse(ipc.Error(status=429, code="queue_full", message="queue is full"))
    r = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
    error = assert_error(r, 429, code="rate_limit_exceeded")
    assert error["type"] == "requests"
    assert int(r.headers["retry-after"]) >= 1


# ---------------------------------------------------------------- CORS


async def test_cors_is_off_by_default(engine, client):
    preflight = await client.options("/v1/chat/completions", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    assert_error(preflight, 405)
    assert not any(h.startswith("access-control-") for h in preflight.headers)
    r = await client.post("/v1/chat/completions", json=CHAT, headers={"Origin": "https://evil.example"})
    assert r.status_code == 200
    assert not any(h.startswith("access-control-") for h in r.headers)


async def test_cors_origins_allow_the_listed_origins(engine, make_client):
    preflight_headers = {"Access-Control-Request-Method": "POST",
                         "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"}
    async with make_client(CORS_ORIGINS="https://app.example, http://localhost:3000") as client:
        ok = await client.options("/v1/chat/completions", headers={"Origin": "http://localhost:3000",
                                                                   **preflight_headers})
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert "POST" in ok.headers["access-control-allow-methods"]
        refused = await client.options("/v1/chat/completions", headers={"Origin": "https://evil.example",
                                                                        **preflight_headers})
        assert_error(refused, 400)
        assert "access-control-allow-origin" not in refused.headers
        r = await client.post("/v1/chat/completions", json=CHAT, headers={"Origin": "https://app.example"})
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        assert "x-request-id" in r.headers["access-control-expose-headers"].lower()


async def test_cors_origins_star_allows_any_origin(engine, make_client):
    async with make_client(CORS_ORIGINS="*") as client:
        r = await client.post("/v1/chat/completions", json=CHAT, headers={"Origin": "https://any.example"})
    assert r.headers["access-control-allow-origin"] == "*"


@pytest.mark.parametrize("value", ["app.example", "https://app.example/path", "https://a.example,,ftp//x"])
def test_cors_origins_that_are_not_origins_stop_the_start(value):
    with pytest.raises(ConfigError, match="CORS_ORIGINS="):
        load_settings({"CORS_ORIGINS": value}, "/nonexistent/.env")


def test_cors_origins_are_trimmed():
    settings = load_settings({"CORS_ORIGINS": " https://a.example/ , http://localhost:3000,"}, "/nonexistent/.env")
    assert settings.cors_origins == ["https://a.example", "http://localhost:3000"]


# ---------------------------------------------------------------- log lines a client cannot forge


async def test_a_crlf_in_the_path_cannot_forge_an_access_log_line(engine, client, caplog):
    caplog.set_level(logging.DEBUG, logger="api")
    await client.get("/v1/models%0d%0a2026-01-01 00:00:00,000 INFO    api.access: forged%E2%80%A8line")
    await client.get("/health%0aforged")
    lines = [r.getMessage() for r in caplog.records if r.name == "api.access"]
    assert len(lines) == 2
    assert not any(c in line for line in lines for c in "\r\n\u2028")
    assert "\\r\\n2026-01-01" in lines[0] and "\\u2028line" in lines[0]


async def test_unknown_field_names_are_escaped_in_the_debug_log(engine, client, caplog):
    caplog.set_level(logging.DEBUG, logger="api.bodies")
    await client.post("/v1/chat/completions", json={**CHAT, "x\ny": 1})
    assert any("x\\ny" in r.getMessage() for r in caplog.records)
    assert not any("\n" in r.getMessage() for r in caplog.records)


def test_escape_keeps_printable_text_and_escapes_the_rest():
    from api.access import escape

    assert escape("/v1/models/qwen é ✓") == "/v1/models/qwen é ✓"
    assert escape("a\r\nb\x00c\x1bd\x7fe\x85f\u2028g\u2029h\\i") == (
        "a\\r\\nb\\x00c\\x1bd\\x7fe\\x85f\\u2028g\\u2029h\\\\i")


# ---------------------------------------------------------------- property: never a 5xx

SAFE = settings(max_examples=200, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
# integers around the edges of int32, int64 and uint64, where the wire's limits are
edges = st.sampled_from([2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**70, -(2**63), -(2**63) - 1])
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**80), 2**80), edges, st.floats(allow_nan=False),
                    st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=12)
FIELDS = ["seed", "logit_bias", "top_k", "n", "max_tokens", "temperature", "stop", "tools", "tool_choice",
          "response_format", "logprobs", "top_logprobs", "stream", "stream_options", "messages", "model", "user"]
# a valid request with one or two fields replaced: most examples get past the JSON layer
mutated_chats = st.builds(lambda extra: {**CHAT, **extra},
                          st.dictionaries(st.sampled_from(FIELDS), edges | values, min_size=1, max_size=2))


async def _post_never_5xx(client, body: bytes) -> None:
    with anyio.fail_after(10):
        r = await client.post("/v1/chat/completions", content=body, headers=JSON)
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}


@SAFE
@given(st.one_of(
    st.binary(max_size=200),
    st.binary(max_size=40).map(lambda b: json.dumps(CHAT).encode()[:-1] + b),
    # arbitrary bytes inside a string: JSON that is well formed but maybe not UTF-8
    st.binary(max_size=20).map(lambda b: json.dumps({**CHAT, "user": "@"}).encode().replace(b"@", b)),
))
async def test_arbitrary_bytes_never_get_a_5xx(engine, client, body):
    await _post_never_5xx(client, body)


@SAFE
@given(st.one_of(values, mutated_chats))
async def test_arbitrary_json_never_gets_a_5xx(engine, client, value):
    await _post_never_5xx(client, json.dumps(value).encode())
