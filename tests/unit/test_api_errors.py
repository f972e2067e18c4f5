"""Validation, refusals, auth, body limits and engine errors: every failure is an OpenAI error object."""

from __future__ import annotations

import logging

import pytest

import ipc
from api.errors import ContextLengthExceeded, EngineUnavailable, GenerationTimeout, Overloaded, from_wire
from tests.unit.openai_errors import assert_error

pytestmark = pytest.mark.anyio

CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "Hi"}]}


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"temperature": 5}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 10**6}, "max_tokens"),
        ({"max_completion_tokens": 10**6}, "max_completion_tokens"),
        ({"presence_penalty": -3}, "presence_penalty"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"content": "x"}]}, "messages[0].role"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"model": None}, "model"),
        ({"n": 0}, "n"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {
            "type": "function", "function": {"name": "g"}}}, "tool_choice"),
        ({"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools[0].type"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"messages": [{"role": "tool", "content": "42"}]}, "messages[0].tool_call_id"),
    ],
)
async def test_validation_errors_name_the_param(client, change, param):
    r = await client.post("/v1/chat/completions", json={**CHAT, **change})
    assert_error(r, 400, param=param, type_="invalid_request_error")


async def test_missing_field_is_named(client):
    r = await client.post("/v1/chat/completions", json={"model": "test-model"})
    error = assert_error(r, 400, param="messages")
    assert error["message"] == "Missing required parameter: 'messages'."


async def test_unknown_fields_are_tolerated_and_logged_at_debug(engine, client, caplog):
    caplog.set_level(logging.DEBUG, logger="api.bodies")
    r = await client.post("/v1/chat/completions", json={**CHAT, "store": True, "metadata": {"a": "b"}})
    assert r.status_code == 200, r.text
    assert "ignoring unknown fields of ChatCompletionRequest: metadata, store" in caplog.text


async def test_an_empty_image_is_refused_naming_its_part(client):
    content = [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "data:,"}}]
    r = await client.post("/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": content}]})
    error = assert_error(r, 400, param="messages[0].content[1].image_url")
    assert "unsupported image format" in error["message"]


@pytest.mark.parametrize("body", [b"{not json", b"", b"[1, 2]"])
async def test_malformed_bodies(client, body):
    r = await client.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert_error(r, 400, param=None, type_="invalid_request_error")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": {"name": "f"}}, "function_call"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ],
)
async def test_unsupported_parameters_are_refused_by_name(engine, client, extra, param):
    r = await client.post("/v1/chat/completions", json={**CHAT, **extra})
    error = assert_error(r, 400, param=param, code="unsupported_parameter")
    assert f"'{param}'" in error["message"]
    assert engine.generates == []


@pytest.mark.parametrize(
    "extra",
    [{"tools": []}, {"tool_choice": "none"}, {"response_format": {"type": "text"}}, {"logprobs": False}, {"n": 1},
     {"parallel_tool_calls": True}, {"user": "u1"}, {"stream": False}],
)
async def test_default_values_are_accepted(engine, client, extra):
    r = await client.post("/v1/chat/completions", json={**CHAT, **extra})
    assert r.status_code == 200, r.text


async def test_unknown_model_is_404_naming_the_served_model(engine, client):
    r = await client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-4o"})
    error = assert_error(r, 404, param="model", code="model_not_found")
    assert "test-model" in error["message"]
    assert engine.generates == []


async def test_oversized_body_is_413(make_client):
    async with make_client(MAX_REQUEST_BYTES=1024) as client:
        r = await client.post("/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]})
    assert_error(r, 413, code="request_too_large")


async def test_unknown_route_and_wrong_method(client):
    assert_error(await client.get("/v1/nothing"), 404, type_="invalid_request_error")
    r = await client.get("/v1/chat/completions")
    assert_error(r, 405)
    assert "POST" in r.headers["allow"]


async def test_api_key(engine, make_client):
    async with make_client(API_KEY="sekret") as client:
        assert_error(await client.get("/v1/models"), 401, code="invalid_api_key", type_="invalid_request_error")
        wrong = await client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer nope"})
        assert_error(wrong, 401, code="invalid_api_key")
        assert_error(await client.get("/v1/unknown"), 401, code="invalid_api_key")
        ok = await client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer sekret"})
        assert ok.status_code == 200
        assert (await client.get("/health")).status_code == 200


async def test_engine_down_is_503_with_retry_after(client):
    for stream in (False, True):
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
        assert_error(r, 503, code="engine_unavailable", type_="server_error")
        assert r.headers["retry-after"] == "5"


@pytest.mark.parametrize("stream", [False, True])
async def test_engine_queue_full_is_429_with_retry_after(engine, client, stream):
    engine.refuse(ipc.Error(status=429, code="queue_full", message="queue is full"))
    r = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
    error = assert_error(r, 429, code="rate_limit_exceeded", type_="requests")
    assert error["message"] == "queue is full"
    assert int(r.headers["retry-after"]) >= 1


async def test_context_length_exceeded_keeps_its_code_and_param(engine, client):
    engine.refuse(ipc.Error(status=400, code="context_length_exceeded",
                            param="messages", message="too long"))
    r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert_error(r, 400, param="messages", code="context_length_exceeded")


async def test_engine_dies_before_finishing_non_streaming_is_503(engine, client):
    engine.die_after(["Hel"])
    assert_error(await client.post("/v1/chat/completions", json=CHAT), 503, code="engine_unavailable")


async def test_request_timeout_non_streaming_is_504(engine, make_client):
    engine.hold(["Hel"])
    async with make_client(REQUEST_TIMEOUT=0.2) as client:
        error = assert_error(await client.post("/v1/chat/completions", json=CHAT), 504, code="timeout")
    assert "REQUEST_TIMEOUT" in error["message"]


def test_from_wire_rebuilds_the_class():
    def wire(status, code=None):
        return from_wire(ipc.Error(status=status, message="m", code=code))

    assert type(wire(400, "context_length_exceeded")) is ContextLengthExceeded
    assert type(wire(429, "queue_full")) is Overloaded and wire(429, "queue_full").code == "rate_limit_exceeded"
    assert type(wire(503)) is EngineUnavailable and wire(503).code == "engine_unavailable"
    assert type(wire(504, "request_timeout")) is GenerationTimeout
    assert wire(418).status == 500
