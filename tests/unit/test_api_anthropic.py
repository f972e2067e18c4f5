"""/v1/messages and /v1/messages/count_tokens against a fake engine speaking the real wire protocol."""

from __future__ import annotations

import json
import re

import anyio
import msgspec
import pytest

import ipc
from ipc.messages import ToolCall
from api.anthropic.errors import error_body
from api.anthropic.protocol import MessagesRequest
from api.anthropic.serving import messages_generate
from config import load_settings
from api.errors import (ContextLengthExceeded, EngineUnavailable, GenerationFailed, GenerationTimeout, ModelNotFound,
                        Overloaded, Unauthorized)
from tests.unit.named_events import events_of, play, slow_prefill

pytestmark = pytest.mark.anyio

BODY = {"model": "test-model", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}
WEATHER = {"name": "weather", "description": "The weather", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def tool_call_events():
    call = ToolCall(id="call_abc", name="weather", arguments='{"city": "Paris"}')
    return (ipc.Delta(request_id="", text="", reasoning="Think", completion_tokens=1),
            ipc.Finish(request_id="", finish_reason="stop", prompt_tokens=7, completion_tokens=5, text="\n",
                       tool_calls=[call]))


async def test_non_streaming_message_shape(engine, client):
    r = await client.post("/v1/messages?beta=true", json=BODY,
                          headers={"anthropic-version": "2023-06-01", "anthropic-beta": "x"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert re.fullmatch(r"msg_[0-9a-f]{32}", body["id"])
    assert body == {"id": body["id"], "type": "message", "role": "assistant", "model": "test-model",
                    "content": [{"type": "text", "text": "Hello world"}], "stop_reason": "end_turn",
                    "stop_sequence": None, "usage": {"input_tokens": 7, "output_tokens": 2,
                                                                 "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}}
    assert engine.generates[0].request_id == body["id"]


async def test_length_is_max_tokens(engine, client):
    engine.reply_with(["a"], finish_reason="length")
    assert (await client.post("/v1/messages", json=BODY)).json()["stop_reason"] == "max_tokens"


@pytest.mark.parametrize("stream", [False, True])
async def test_the_matched_stop_sequence_is_named(engine, client, stream):
    play(engine, ipc.Delta(request_id="", text="Hello", completion_tokens=1),
         ipc.Finish(request_id="", finish_reason="stop", prompt_tokens=7, completion_tokens=2, stop_sequence="END"))
    r = await client.post("/v1/messages", json={**BODY, "stop_sequences": ["STOP", "END"], "stream": stream})
    assert r.status_code == 200, r.text
    if stream:
        (delta,) = [data["delta"] for name, data in events_of(r.text) if name == "message_delta"]
    else:
        delta = r.json()
        assert delta["content"] == [{"type": "text", "text": "Hello"}]
    assert (delta["stop_reason"], delta["stop_sequence"]) == ("stop_sequence", "END")


async def test_a_stop_without_a_stop_sequence_is_end_turn(engine, client):
    engine.reply_with(["a"], finish_reason="stop")
    body = (await client.post("/v1/messages", json={**BODY, "stop_sequences": ["END"]})).json()
    assert (body["stop_reason"], body["stop_sequence"]) == ("end_turn", None)


async def test_translation_to_the_chat_generate(engine, client):
    body = {
        "model": "default", "max_tokens": 9, "temperature": 0, "top_p": 0.5, "top_k": 3, "stop_sequences": ["END"],
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1;"},
                   {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hm", "signature": "s"},
                {"type": "text", "text": "Calling."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "cold"}]},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": True},
                {"type": "text", "text": "thanks"}]},
            {"role": "system", "content": "Mid-conversation note."},
        ],
        "tools": [WEATHER, {"type": "web_search_20250305", "name": "web_search"}],
        "tool_choice": {"type": "tool", "name": "weather", "disable_parallel_tool_use": True},
        "thinking": {"type": "disabled"}, "metadata": {"user_id": "u"}, "context_management": {"edits": []},
        "output_config": {"effort": "low"},
    }
    assert (await client.post("/v1/messages", json=body)).status_code == 200
    gen = engine.generates[0]
    assert gen.kind == "chat"
    assert gen.params.max_tokens == 9 and gen.params.temperature == 0 and gen.params.top_p == 0.5
    assert gen.params.top_k == 3 and gen.params.stop == ["END"]
    assert gen.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "one\ntwo"},
        {"role": "assistant", "content": "Calling.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "cold"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: boom"},
        {"role": "user", "content": "thanks"},
        {"role": "system", "content": "Mid-conversation note."},
    ]
    assert gen.tools == [{"type": "function", "function": {
        "name": "weather", "description": "The weather", "parameters": WEATHER["input_schema"]}}]
    assert gen.tool_choice == {"type": "function", "function": {"name": "weather"}}
    assert gen.parallel_tool_calls is False
    assert gen.enable_thinking is False and gen.reasoning_effort == "low"


@pytest.mark.parametrize(("choice", "wire"), [("auto", "auto"), ("any", "required"), ("none", "none")])
async def test_tool_choice(engine, client, choice, wire):
    r = await client.post("/v1/messages", json={**BODY, "tools": [WEATHER], "tool_choice": {"type": choice}})
    assert r.status_code == 200
    assert engine.generates[0].tool_choice == wire


@pytest.mark.parametrize(("thinking", "switch"), [("enabled", True), ("adaptive", None), ("disabled", False)])
async def test_thinking_switch(engine, client, thinking, switch):
    r = await client.post("/v1/messages", json={**BODY, "thinking": {"type": thinking, "budget_tokens": 1024}})
    assert r.status_code == 200
    assert engine.generates[0].enable_thinking is switch


async def test_tool_use_and_thinking_blocks(engine, client):
    play(engine, *tool_call_events())
    body = (await client.post("/v1/messages", json={**BODY, "tools": [WEATHER]})).json()
    assert body["content"] == [
        {"type": "thinking", "thinking": "Think", "signature": ""},
        {"type": "tool_use", "id": "toolu_abc", "name": "weather", "input": {"city": "Paris"}},
    ]
    assert body["stop_reason"] == "tool_use"


async def test_stream_event_sequence(engine, client):
    play(engine, *tool_call_events())
    r = await client.post("/v1/messages", json={**BODY, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = events_of(r.text)
    assert [name for name, _ in events] == [
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop"]
    assert all(data["type"] == name for name, data in events)
    assert events[0][1]["message"]["usage"] == {"input_tokens": 7, "output_tokens": 0, "cache_read_input_tokens": 0,
                                                     "cache_creation_input_tokens": 0}
    assert events[3][1]["delta"] == {"type": "thinking_delta", "thinking": "Think"}
    # the whitespace before the call makes no text block, as in the non-streamed message
    assert events[5][1]["content_block"] == {"type": "tool_use", "id": "toolu_abc", "name": "weather", "input": {}}
    assert json.loads(events[6][1]["delta"]["partial_json"]) == {"city": "Paris"}
    assert [data["index"] for _, data in events[2:8]] == [0, 0, 0, 1, 1, 1]
    assert events[8][1] == {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                            "usage": {"input_tokens": 7, "output_tokens": 5, "cache_read_input_tokens": 0}}


@pytest.mark.parametrize(("pieces", "deltas"), [([" ", "\n", "Hi", " there"], [" \nHi", " there"]),
                                                ([" ", "\n"], [" \n"])])
async def test_leading_whitespace_is_held_until_text_follows(engine, client, pieces, deltas):
    engine.reply_with(pieces)
    events = events_of((await client.post("/v1/messages", json={**BODY, "stream": True})).text)
    streamed = [data["delta"]["text"] for name, data in events if name == "content_block_delta"]
    assert streamed == deltas
    assert [name for name, _ in events].count("content_block_start") == 1
    body = (await client.post("/v1/messages", json=BODY)).json()
    assert body["content"] == [{"type": "text", "text": "".join(pieces)}]


async def test_error_after_headers_is_an_error_event(engine, client):
    engine.die_after(["Hel"])
    r = await client.post("/v1/messages", json={**BODY, "stream": True})
    name, data = events_of(r.text)[-1]
    assert name == "error"
    assert data["type"] == "error" and data["error"]["type"] == "overloaded_error"


@pytest.mark.parametrize(("change", "param"), [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0].source.type"),
    ({"max_tokens": None}, "max_tokens"),
    ({"temperature": 1.5}, "temperature"),
    ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": [WEATHER]}, "tool_choice.name"),
    ({"tool_choice": {"type": "tool"}, "tools": [WEATHER]}, "Missing required parameter: 'tool_choice.name'"),
])
async def test_bad_requests_answer_anthropic_400(engine, client, change, param):
    body = {k: v for k, v in {**BODY, **change}.items() if v is not None}
    r = await client.post("/v1/messages", json=body)
    assert r.status_code == 400
    error = r.json()
    assert list(error) == ["type", "error"] and error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"
    assert param in error["error"]["message"]
    assert not engine.generates


async def test_image_without_data_is_named(engine, client):
    r = await client.post("/v1/messages", json={**BODY, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}]})
    assert "'messages[0].content[0].source.data'" in r.json()["error"]["message"]


async def test_unknown_model_is_not_found_error(engine, client):
    r = await client.post("/v1/messages", json={**BODY, "model": "claude-x"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


async def test_engine_refusal_keeps_its_status(engine, client):
    engine.refuse(ipc.Error(status=429, message="queue full", code="queue_full"))
    r = await client.post("/v1/messages", json=BODY)
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
    assert r.headers["retry-after"] == "1"


@pytest.mark.parametrize(("err", "kind"), [
    (ContextLengthExceeded("x"), "invalid_request_error"), (Unauthorized("x"), "authentication_error"),
    (ModelNotFound("x"), "not_found_error"), (Overloaded("x"), "rate_limit_error"),
    (GenerationFailed("x"), "api_error"), (EngineUnavailable("x"), "overloaded_error"),
    (GenerationTimeout("x"), "timeout_error"),
])
def test_error_envelope(err, kind):
    assert error_body(err) == {"type": "error", "error": {"type": kind, "message": "x"}}


async def test_x_api_key_is_accepted_on_messages_only(engine, make_client):
    async with make_client(API_KEY="sekret") as client:
        r = await client.post("/v1/messages", json=BODY, headers={"x-api-key": "sekret"})
        assert r.status_code == 200
        r = await client.post("/v1/messages", json=BODY, headers={"x-api-key": "wrong"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = await client.post("/v1/messages", json=BODY, headers={"authorization": "Bearer sekret"})
        assert r.status_code == 200
        r = await client.post("/v1/chat/completions", headers={"x-api-key": "sekret"},
                              json={"model": "test-model", "messages": [{"role": "user", "content": "Hi"}]})
        assert r.status_code == 401 and "error" in r.json() and "type" not in r.json()


async def test_prompt_tokens_from_the_prefix_cache_are_cache_reads(engine, client):
    engine.cached_tokens = 5
    body = (await client.post("/v1/messages", json=BODY)).json()
    assert body["usage"] == {"input_tokens": 2, "output_tokens": 2, "cache_read_input_tokens": 5,
                             "cache_creation_input_tokens": 0}
    events = events_of((await client.post("/v1/messages", json={**BODY, "stream": True})).text)
    (delta,) = [data for name, data in events if name == "message_delta"]
    assert delta["usage"] == {"input_tokens": 2, "output_tokens": 2, "cache_read_input_tokens": 5}
    # message_start already splits the prompt so: a client reading it alone does not over-count
    assert events[0][1]["message"]["usage"] == {"input_tokens": 2, "output_tokens": 0, "cache_read_input_tokens": 5,
                                                "cache_creation_input_tokens": 0}


async def test_a_queued_request_pings_until_it_joins_the_batch_then_starts_with_its_cache_reads(
        engine, client, monkeypatch):
    monkeypatch.setattr("api.anthropic.streaming.PING_SECONDS", 0.05)

    async def queued(conn: ipc.FramedStream, msg: ipc.Generate) -> None:
        rid = msg.request_id
        await conn.send(ipc.Started(request_id=rid, prompt_tokens=7))
        await anyio.sleep(0.4)  # waiting for a batch slot: the engine does not know the cached share yet
        await conn.send(ipc.Delta(request_id=rid, text="", completion_tokens=0, cached_tokens=5))
        await conn.send(ipc.Finish(request_id=rid, finish_reason="stop", prompt_tokens=7, completion_tokens=1,
                                   cached_tokens=5, text="ok"))

    engine.script = queued
    events = events_of((await client.post("/v1/messages", json={**BODY, "stream": True})).text)
    names = [name for name, _ in events]
    start = names.index("message_start")
    assert start >= 2 and set(names[:start]) == {"ping"}
    assert events[start][1]["message"]["usage"]["cache_read_input_tokens"] == 5
    assert events[start][1]["message"]["usage"]["input_tokens"] == 2


async def test_count_tokens_tokenizes_the_prompt_create_would_send_without_a_generation(engine, client):
    body = {k: v for k, v in BODY.items() if k != "max_tokens"}
    r = await client.post("/v1/messages/count_tokens", json=body)
    assert r.status_code == 200
    (asked,) = engine.token_requests
    create = messages_generate(msgspec.convert({**body, "max_tokens": 1}, MessagesRequest), "m",
                               load_settings({"SERVED_MODEL_NAME": "test-model"}, "/nonexistent/.env"))
    assert asked.kind == "chat" and asked.messages == create.messages and asked.tools == create.tools
    assert r.json() == {"input_tokens": len("".join(m["content"] for m in create.messages))}
    assert not engine.generates  # no batch slot taken, so never a 429


async def test_pings_keep_a_long_prefill_alive(engine, client, monkeypatch):
    monkeypatch.setattr("api.anthropic.streaming.PING_SECONDS", 0.05)
    slow_prefill(engine, 0.4)
    names = [name for name, _ in events_of((await client.post("/v1/messages", json={**BODY, "stream": True})).text)]
    assert names[:2] == ["message_start", "ping"] and names.count("ping") >= 3
    assert [n for n in names if n != "ping"][1:] == [
        "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]


async def test_request_timeout_still_ends_a_pinging_stream(engine, make_client, monkeypatch):
    monkeypatch.setattr("api.anthropic.streaming.PING_SECONDS", 0.05)
    engine.hold([])
    async with make_client(REQUEST_TIMEOUT=0.3) as client:
        with anyio.fail_after(5):
            r = await client.post("/v1/messages", json={**BODY, "stream": True})
    name, data = events_of(r.text)[-1]
    assert name == "error" and data["error"]["type"] == "timeout_error"


async def test_an_engine_refusal_names_anthropics_parameters_not_openais(engine, client):
    engine.refuse(ipc.Error(status=400, param="tools[0].function.parameters",
                            message="tools[0].function.parameters (function 'weather') must be a JSON schema object"))
    r = await client.post("/v1/messages", json={**BODY, "tools": [WEATHER]})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "tools[0].input_schema (function 'weather') must be a JSON schema object"
    engine.refuse(ipc.Error(status=400, param="stop", message="a stop string must have 1 to 1024 characters"))
    r = await client.post("/v1/messages", json={**BODY, "stop_sequences": ["x" * 2000]})
    assert r.json()["error"]["message"] == "a stop_sequences string must have 1 to 1024 characters"


async def test_a_tool_without_a_name_is_refused_naming_anthropics_field(engine, client):
    r = await client.post("/v1/messages", json={**BODY, "tools": [{**WEATHER, "name": ""}]})
    assert r.status_code == 400 and "tools[0].name" in r.json()["error"]["message"]
    assert "function" not in r.json()["error"]["message"] and not engine.generates


PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "pets": {"type": "array", "items": {
    "type": "object", "properties": {"kind": {"type": "string"}}}}}, "required": ["name"]}
CLOSED_PERSON = {**PERSON, "additionalProperties": False, "properties": {**PERSON["properties"], "pets": {
    "type": "array", "items": {"type": "object", "properties": {"kind": {"type": "string"}},
                               "additionalProperties": False}}}}


@pytest.mark.parametrize("field", [
    {"output_config": {"format": {"type": "json_schema", "schema": PERSON}, "effort": "high"}},
    {"output_format": {"type": "json_schema", "schema": PERSON}},  # the structured-outputs beta's spelling
])
async def test_structured_outputs_reach_the_engine_as_its_json_schema(engine, client, field):
    # Anthropic reads every object as closed: one that does not say additionalProperties gets false
    r = await client.post("/v1/messages", json={**BODY, **field})
    assert r.status_code == 200, r.text
    assert engine.generates[0].json_schema == CLOSED_PERSON
    r = await client.post("/v1/messages", json={**BODY, "output_config": {"effort": "low"}})
    assert r.status_code == 200 and engine.generates[1].json_schema is None


@pytest.mark.parametrize(("fmt", "words"), [
    ({"type": "json_object", "schema": PERSON}, ["output_config.format.type"]),
    ({"type": "json_schema"}, ["schema", "output_config.format"]),
    ({"type": "json_schema", "schema": "{}"}, ["output_config.format.schema"]),
])
async def test_a_malformed_output_format_is_an_anthropic_400(engine, client, fmt, words):
    r = await client.post("/v1/messages", json={**BODY, "output_config": {"format": fmt}})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    for word in words:
        assert word in r.json()["error"]["message"], r.text
    assert not engine.generates


async def test_a_schema_the_engine_cannot_enforce_is_named_in_anthropics_words(engine, client):
    engine.refuse(ipc.Error(status=400, param="response_format",
                            message="cannot enforce response_format: invalid JSON schema: unknown type 'thing'"))
    r = await client.post("/v1/messages", json={**BODY, "output_config": {"format": {
        "type": "json_schema", "schema": {"type": "thing"}}}})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == ("cannot enforce output_config.format: invalid JSON schema: unknown type "
                                            "'thing'")


async def test_effort_reaches_the_engine_as_its_reasoning_level_and_count_tokens_renders_it(engine, client):
    r = await client.post("/v1/messages", json={**BODY, "output_config": {"effort": "xhigh"}})
    assert r.status_code == 200 and engine.generates[0].reasoning_effort == "xhigh"
    count = {k: v for k, v in BODY.items() if k != "max_tokens"}
    r = await client.post("/v1/messages/count_tokens", json={**count, "output_config": {"effort": "max"}})
    assert r.status_code == 200 and engine.token_requests[-1].reasoning_effort == "max"
    r = await client.post("/v1/messages", json={**BODY, "output_config": {"effort": "extreme"}})
    assert r.status_code == 400 and "output_config.effort" in r.json()["error"]["message"]
    assert "low, medium, high, xhigh, max" in r.json()["error"]["message"] and len(engine.generates) == 1
