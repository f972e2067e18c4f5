"""/v1/responses against a fake engine speaking the real wire protocol: translation, rendering, streams, errors.

Bodies and stream events are also validated with the official openai SDK's own types.
"""

from __future__ import annotations

import json
import logging
import re

import importlib

import anyio
import msgspec
import openai
import pydantic
import pytest
from openai.types.responses import Response as SDKResponse
from openai.types.responses import ResponseStreamEvent

import ipc
from api import create_app
from api.responses import serving
from api.responses.serving import prompt_name
from ipc.messages import ToolCall, TokenLogprob, TopLogprob
from tests.unit.named_events import events_of, play, slow_prefill
from tests.unit.openai_errors import assert_error

pytestmark = pytest.mark.anyio

BODY = {"model": "test-model", "input": "Hi"}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
FUNCTION = {"type": "function", "name": "get_weather", "description": "Forecast", "parameters": WEATHER,
            "strict": True}
# a namespace tool as Codex sends its MCP tools
CALENDAR = {"type": "namespace", "name": "mcp__calendar", "description": "Plan events", "tools": [
    {"type": "function", "name": "create_event", "description": "Create an event.", "strict": False,
     "parameters": {"type": "object", "properties": {"title": {"type": "string"}}}, "defer_loading": True},
]}
SDK_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)


def delta(text: str = "", tokens: int = 1, **kw) -> ipc.Delta:
    return ipc.Delta(request_id="", text=text, completion_tokens=tokens, **kw)


def finish(tokens: int, reason: str = "stop", text: str = "", **kw) -> ipc.Finish:
    return ipc.Finish(request_id="", finish_reason=reason, prompt_tokens=7, completion_tokens=tokens, text=text, **kw)


def thinking_then_call():
    """Two tokens of thinking, whitespace, then a call of a namespaced tool."""
    call = ToolCall(id="call_abc", name="mcp__calendar__create_event", arguments='{"title": "Lunch"}')
    return (delta(reasoning="Let me ", tokens=1), delta(reasoning="think.", tokens=2), delta("\n", tokens=3),
            finish(5, tool_calls=[call]))


def without_ids(value):
    """value with every item id blanked: two answers are compared by their content."""
    if isinstance(value, dict):
        return {k: ("" if k in ("id", "item_id") else without_ids(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [without_ids(v) for v in value]
    return value


# ---------------------------------------------------------------- bodies


async def test_non_streaming_shape_parses_with_the_sdk(engine, client):
    r = await client.post("/v1/responses", json={**BODY, "store": True, "metadata": {"k": "v"}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert re.fullmatch(r"resp_[0-9a-f]{32}", body["id"])
    assert r.headers["x-request-id"] == body["id"] == engine.generates[0].request_id
    assert body["object"] == "response" and body["status"] == "completed" and body["model"] == "test-model"
    (message,) = body["output"]
    assert re.fullmatch(r"msg_[0-9a-f]{32}", message["id"])
    assert message == {"type": "message", "id": message["id"], "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": "Hello world", "annotations": [], "logprobs": []}]}
    assert body["usage"] == {"input_tokens": 7, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                             "output_tokens": 2, "output_tokens_details": {"reasoning_tokens": 0},
                             "total_tokens": 9}
    # nothing is kept: the body says so whatever the request asked
    assert body["store"] is False and body["metadata"] == {"k": "v"} and body["error"] is None
    assert body["tools"] == [] and body["tool_choice"] == "auto" and body["text"] == {
        "format": {"type": "text"}, "verbosity": "medium"}
    parsed = SDKResponse.model_validate(body)
    assert parsed.output_text == "Hello world"


async def test_string_input_and_instructions(engine, client):
    r = await client.post("/v1/responses", json={**BODY, "instructions": "Be brief.", "max_output_tokens": 9,
                                                "temperature": 0, "top_p": 0.5, "seed": -3})
    assert r.status_code == 200
    gen = engine.generates[0]
    assert gen.kind == "chat"
    assert gen.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert gen.params.max_tokens == 9 and gen.params.temperature == 0 and gen.params.top_p == 0.5
    assert gen.params.seed == -3 and gen.params.logprobs is False
    assert gen.tools is None and gen.tool_choice is None and gen.json_schema is None and gen.enable_thinking is None
    assert r.json()["instructions"] == "Be brief." and r.json()["max_output_tokens"] == 9


async def test_translation_of_every_input_item(engine, client):
    body = {
        "model": "default",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Rules."}]},
            {"role": "user", "content": [{"type": "input_text", "text": "one"}, {"type": "input_text", "text": "two"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
             "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
             "arguments": '{"city": "Oslo"}', "status": "completed"},
            {"type": "function_call", "call_id": "call_2", "namespace": "mcp__calendar", "name": "create_event",
             "arguments": ""},
            {"type": "function_call_output", "call_id": "call_1", "output": "cold"},
            {"type": "function_call_output", "call_id": "call_2",
             "output": [{"type": "input_text", "text": "created"}, {"type": "input_text", "text": "at noon"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}],
             "content": [{"type": "reasoning_text", "text": "hm"}]},
            {"type": "function_call", "call_id": "call_3", "name": "get_weather", "arguments": {"city": "Rome"}},
            {"type": "function_call_output", "call_id": "call_3", "output": "warm"},
            {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},
            {"role": "system", "content": "Mid-conversation note."},
        ],
    }
    assert (await client.post("/v1/responses", json=body)).status_code == 200
    assert engine.generates[0].messages == [
        {"role": "system", "content": "Rules."},
        {"role": "user", "content": "one\ntwo"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
            {"id": "call_2", "type": "function", "function": {"name": "mcp__calendar__create_event",
                                                              "arguments": {}}}]},
        {"role": "tool", "content": "cold", "tool_call_id": "call_1"},
        {"role": "tool", "content": "created\nat noon", "tool_call_id": "call_2"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_3", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "content": "warm", "tool_call_id": "call_3"},
        {"role": "assistant", "content": "No."},
        {"role": "system", "content": "Mid-conversation note."},
    ]


async def test_the_same_conversation_makes_the_same_engine_request_as_chat(engine, client):
    chat = {"model": "test-model", "max_tokens": 24, "temperature": 0, "seed": 5, "parallel_tool_calls": False,
            "tool_choice": "auto", "response_format": {"type": "json_schema", "json_schema": {
                "name": "w", "schema": WEATHER}},
            "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Forecast",
                                                        "parameters": WEATHER, "strict": True}}],
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "hello"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]}
    responses = {"model": "test-model", "max_output_tokens": 24, "temperature": 0, "seed": 5,
                 "parallel_tool_calls": False, "tool_choice": "auto", "instructions": "Be brief.",
                 "text": {"format": {"type": "json_schema", "name": "w", "schema": WEATHER}},
                 "tools": [FUNCTION],
                 "input": [
                     {"role": "user", "content": "hello"},
                     {"type": "message", "role": "assistant",
                      "content": [{"type": "output_text", "text": "Checking."}]},
                     {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                      "arguments": '{"city": "Paris"}'},
                     {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]}
    assert (await client.post("/v1/chat/completions", json=chat)).status_code == 200
    assert (await client.post("/v1/responses", json=responses)).status_code == 200
    by_chat, by_responses = (msgspec.structs.replace(g, request_id="") for g in engine.generates)
    assert by_responses == by_chat


async def test_tools_namespaces_and_hosted_tools(engine, client, caplog, monkeypatch):
    monkeypatch.setattr(serving, "_left_out", set())
    body = {**BODY, "tools": [
        FUNCTION, CALENDAR, {"type": "web_search"}, {"type": "web_search_preview"},
        {"type": "namespace", "name": "functions", "description": "", "tools": [
            {"type": "function", "name": "shell", "parameters": {"type": "object"}},
            {"type": "custom", "name": "apply_patch", "format": {"type": "grammar", "syntax": "lark",
                                                                 "definition": "start: /.+/"}}]},
        {"type": "mcp", "server_label": "x", "server_url": "https://example.invalid"},
        {"type": "file_search", "vector_store_ids": ["vs_1"]}, {"type": "code_interpreter", "container": "auto"},
        {"type": "image_generation"}, {"type": "local_shell"}, {"type": "computer_use_preview"}],
        "tool_choice": {"type": "function", "name": "create_event"}}
    with caplog.at_level(logging.INFO, logger="api.responses.serving"):
        for _ in range(2):
            r = await client.post("/v1/responses", json=body)
            assert r.status_code == 200, r.text
    gen = engine.generates[0]
    assert gen.tools == [
        {"type": "function", "function": {"name": "get_weather", "description": "Forecast", "parameters": WEATHER,
                                          "strict": True}},
        {"type": "function", "function": {"name": "mcp__calendar__create_event", "description": "Create an event.",
                                          "parameters": CALENDAR["tools"][0]["parameters"], "strict": False}},
        {"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}},
    ]
    assert gen.tool_choice == {"type": "function", "function": {"name": "mcp__calendar__create_event"}}
    left_out = [rec.getMessage() for rec in caplog.records if "left out" in rec.getMessage()]
    assert len(left_out) == 9  # once per type, however many requests
    assert all(t in " ".join(left_out) for t in ("web_search_preview", "custom", "mcp", "local_shell"))


@pytest.mark.parametrize(("namespace", "name", "shown"), [
    (None, "shell", "shell"), ("functions", "shell", "shell"), ("mcp__github", "create_issue",
                                                                "mcp__github__create_issue"),
    ("mcp__codex_apps__", "lookup_order", "mcp__codex_apps__lookup_order"), ("collaboration", "spawn_agent",
                                                                             "collaboration__spawn_agent"),
])
def test_prompt_names_of_namespaced_functions(namespace, name, shown):
    assert prompt_name(namespace, name) == shown


async def test_calls_come_back_with_their_namespace(engine, client):
    plain = ToolCall(id="call_p", name="get_weather", arguments='{"city": "Oslo"}')
    nested = ToolCall(id="call_n", name="mcp__calendar__create_event", arguments='{"title": "Lunch"}')
    play(engine, finish(4, tool_calls=[plain, nested]))
    body = (await client.post("/v1/responses", json={**BODY, "tools": [FUNCTION, CALENDAR]})).json()
    assert body["output"] == [
        {"type": "function_call", "id": "fc_p", "call_id": "call_p", "name": "get_weather",
         "arguments": '{"city": "Oslo"}', "status": "completed"},
        {"type": "function_call", "id": "fc_n", "call_id": "call_n", "name": "create_event",
         "namespace": "mcp__calendar", "arguments": '{"title": "Lunch"}', "status": "completed"},
    ]
    parsed = SDKResponse.model_validate(body)
    assert [(c.name, c.namespace) for c in parsed.output] == [("get_weather", None), ("create_event", "mcp__calendar")]


@pytest.mark.parametrize(("choice", "wire", "offered"), [
    ("auto", "auto", ["get_weather", "mcp__calendar__create_event"]),
    ("none", "none", ["get_weather", "mcp__calendar__create_event"]),
    ("required", "required", ["get_weather", "mcp__calendar__create_event"]),
    ({"type": "function", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}},
     ["get_weather", "mcp__calendar__create_event"]),
    ({"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "create_event"},
                                                              {"type": "web_search"}]},
     "required", ["mcp__calendar__create_event"]),
])
async def test_tool_choice(engine, client, choice, wire, offered):
    r = await client.post("/v1/responses", json={**BODY, "tools": [FUNCTION, CALENDAR], "tool_choice": choice})
    assert r.status_code == 200, r.text
    gen = engine.generates[0]
    assert gen.tool_choice == wire and [t["function"]["name"] for t in gen.tools] == offered
    assert r.json()["tool_choice"] == choice


@pytest.mark.parametrize(("effort", "switch", "level"), [
    ("none", False, ""), ("minimal", None, "minimal"), ("low", None, "low"), ("high", None, "high"),
    ("xhigh", None, "xhigh"), (None, None, ""), ("turbo", None, ""),  # a level this server does not know: default
])
async def test_reasoning_effort(engine, client, effort, switch, level):
    r = await client.post("/v1/responses", json={**BODY, "reasoning": {"effort": effort, "summary": "auto"},
                                                "include": ["reasoning.encrypted_content"]})
    assert r.status_code == 200
    assert engine.generates[0].enable_thinking is switch and engine.generates[0].reasoning_effort == level
    assert r.json()["reasoning"] == {"effort": effort, "summary": "auto"}


@pytest.mark.parametrize(("fmt", "schema"), [
    ({"type": "text"}, None), ({"type": "json_object"}, {"type": "object"}),
    # strict reads the object as closed
    ({"type": "json_schema", "name": "w", "schema": WEATHER, "strict": True},
     {**WEATHER, "additionalProperties": False}),
    ({"type": "json_schema", "name": "w", "schema": WEATHER}, WEATHER),
])
async def test_text_format(engine, client, fmt, schema):
    r = await client.post("/v1/responses", json={**BODY, "text": {"format": fmt, "verbosity": "medium"}})
    assert r.status_code == 200
    assert engine.generates[0].json_schema == schema
    assert r.json()["text"] == {"format": fmt, "verbosity": "medium"}


async def test_ignored_fields_are_accepted_and_echoed(engine, client):
    r = await client.post("/v1/responses", json={
        **BODY, "store": True, "truncation": "auto", "user": "u", "safety_identifier": "s", "prompt_cache_key": "k",
        "service_tier": "auto", "background": False, "previous_response_id": None, "max_tool_calls": 3,
        "prompt_cache_retention": "24h", "client_metadata": {"x": "y"}, "stream_options": None,
        "include": ["reasoning.encrypted_content", "web_search_call.action.sources"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["store"] is False and body["truncation"] == "auto" and body["user"] == "u"
    assert body["prompt_cache_key"] == "k" and body["max_tool_calls"] == 3 and body["background"] is False


# ---------------------------------------------------------------- output


async def test_reasoning_item_and_namespaced_call(engine, client):
    play(engine, *thinking_then_call())
    body = (await client.post("/v1/responses", json={**BODY, "tools": [CALENDAR]})).json()
    reasoning, call = body["output"]
    assert reasoning == {"type": "reasoning", "id": reasoning["id"], "summary": [],
                         "content": [{"type": "reasoning_text", "text": "Let me think."}], "encrypted_content": None,
                         "status": "completed"}
    assert reasoning["id"].startswith("rs_")
    # the whitespace before the call makes no message, as the chat endpoint's content is null then
    assert call["type"] == "function_call" and call["namespace"] == "mcp__calendar" and call["name"] == "create_event"
    assert body["usage"]["output_tokens"] == 5 and body["usage"]["output_tokens_details"]["reasoning_tokens"] == 2
    SDKResponse.model_validate(body)


async def test_stream_events_conform_and_build_the_non_streamed_response(engine, client):
    play(engine, *thinking_then_call())
    created = (await client.post("/v1/responses", json={**BODY, "tools": [CALENDAR]})).json()
    play(engine, *thinking_then_call())
    r = await client.post("/v1/responses", json={**BODY, "tools": [CALENDAR], "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    assert "[DONE]" not in r.text
    events = events_of(r.text)
    for name, data in events:
        assert data["type"] == name
        SDK_EVENT.validate_python(data)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert [name for name, _ in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta", "response.reasoning_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    assert [data.get("output_index") for _, data in events[2:13]] == [0] * 7 + [1] * 4
    assert events[0][1]["response"]["status"] == "in_progress" and events[0][1]["response"]["output"] == []
    assert events[9][1]["item"]["arguments"] == "" and events[9][1]["item"]["status"] == "in_progress"
    final = events[-1][1]["response"]
    assert without_ids(final["output"]) == without_ids(created["output"])
    assert final["usage"] == created["usage"]
    # every item that is done is the one the final response lists at its index
    done = [data["item"] for name, data in events if name == "response.output_item.done"]
    assert done == final["output"]


async def test_the_sdk_stream_helper_builds_the_created_response(engine, make_settings):
    """The openai client's own stream state machine (item order, identities, terminal event) accepts the
    events of thinking, text, more thinking and a call, and ends with the items create() returns."""
    events = (delta(reasoning="Hm.", tokens=1), delta("Sure.", tokens=2), delta(reasoning="Go.", tokens=3),
              finish(5, tool_calls=[ToolCall(id="call_x", name="mcp__calendar__create_event", arguments="{}")]))
    # the client's own HTTP library (httpx, or httpx2 in newer releases) gives the in-process transport
    library = next(c.__module__ for c in openai.DefaultAsyncHttpxClient.__mro__
                   if not c.__module__.startswith("openai"))
    http_library = importlib.import_module(library.partition(".")[0])
    transport = http_library.ASGITransport(app=create_app(make_settings()))
    async with openai.DefaultAsyncHttpxClient(transport=transport, base_url="http://test/v1") as http:
        sdk = openai.AsyncOpenAI(base_url="http://test/v1", api_key="x", http_client=http, max_retries=0)
        play(engine, *events)
        created = await sdk.responses.create(model="test-model", input="hi", tools=[CALENDAR])
        play(engine, *events)
        async with sdk.responses.stream(model="test-model", input="hi", tools=[CALENDAR]) as stream:
            kinds = [ev.type async for ev in stream]
            final = await stream.get_final_response()
    assert [item.type for item in created.output] == ["reasoning", "message", "reasoning", "function_call"]

    def summary(response):
        return [(item.type, item.status, getattr(item, "content", None) and [p.text for p in item.content],
                 getattr(item, "namespace", None), getattr(item, "arguments", None)) for item in response.output]

    assert summary(final) == summary(created)
    assert final.output_text == created.output_text == "Sure."
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 4


@pytest.mark.parametrize(("pieces", "deltas"), [([" ", "\n", "Hi", " there"], [" \nHi", " there"]),
                                                ([" ", "\n"], [" \n"])])
async def test_leading_whitespace_is_held_until_text_follows(engine, client, pieces, deltas):
    engine.reply_with(pieces)
    events = events_of((await client.post("/v1/responses", json={**BODY, "stream": True})).text)
    assert [d["delta"] for n, d in events if n == "response.output_text.delta"] == deltas
    assert events[-1][1]["response"]["output"][0]["content"][0]["text"] == "".join(pieces)


async def test_prompt_tokens_from_the_prefix_cache_are_cached_tokens(engine, client):
    engine.cached_tokens = 5
    usage = (await client.post("/v1/responses", json=BODY)).json()["usage"]
    assert usage["input_tokens"] == 7 and usage["input_tokens_details"]["cached_tokens"] == 5


async def test_without_max_output_tokens_the_answer_may_run_to_the_servers_limit(engine, client):
    await client.post("/v1/responses", json=BODY)
    assert engine.generates[0].params.max_tokens == 32768  # MAX_TOKENS_LIMIT
    assert engine.generates[0].params.max_tokens_default  # which the engine fits to the context and KV budget


async def test_max_output_tokens_makes_an_incomplete_response(engine, client):
    engine.reply_with(["a", "b"], finish_reason="length")
    body = (await client.post("/v1/responses", json={**BODY, "max_output_tokens": 2})).json()
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete" and body["completed_at"] is None
    SDKResponse.model_validate(body)
    events = events_of((await client.post("/v1/responses", json={**BODY, "stream": True})).text)
    assert events[-1][0] == "response.incomplete"
    assert events[-2][1]["item"]["status"] == "incomplete"


async def test_logprobs_on_output_text(engine, client):
    lp = TokenLogprob(token="Hi", logprob=-0.5, bytes=[72, 105], top=[TopLogprob(token="Hi", logprob=-0.5,
                                                                                  bytes=[72, 105])])
    for _ in range(2):
        play(engine, finish(1, text="Hi", logprobs=[lp]))
    body = (await client.post("/v1/responses", json={**BODY, "include": ["message.output_text.logprobs"],
                                                     "top_logprobs": 1})).json()
    assert engine.generates[0].params.logprobs is True and engine.generates[0].params.top_logprobs == 1
    expected = [{"token": "Hi", "bytes": [72, 105], "logprob": -0.5,
                 "top_logprobs": [{"token": "Hi", "bytes": [72, 105], "logprob": -0.5}]}]
    assert body["output"][0]["content"][0]["logprobs"] == expected
    events = events_of((await client.post("/v1/responses", json={**BODY, "top_logprobs": 1, "stream": True})).text)
    assert [d["logprobs"] for n, d in events if n == "response.output_text.delta"] == [expected]


async def test_error_after_headers_is_an_error_event_then_response_failed(engine, client):
    engine.die_after(["Hel"])
    r = await client.post("/v1/responses", json={**BODY, "stream": True})
    events = events_of(r.text)
    for _, data in events:
        SDK_EVENT.validate_python(data)
    (error_name, error), (failed_name, failed) = events[-2:]
    assert error_name == "error" and error["code"] == "engine_unavailable" and error["message"]
    assert failed_name == "response.failed"
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["code"] == "server_error"
    # the text so far, as an incomplete message
    (message,) = failed["response"]["output"]
    assert message["status"] == "incomplete" and message["content"][0]["text"] == "Hel"


async def test_engine_failure_without_stream_is_an_http_error(engine, client):
    engine.die_after(["Hel"])
    r = await client.post("/v1/responses", json=BODY)
    assert_error(r, 503, code="engine_unavailable", type_="server_error")


async def test_request_timeout_ends_a_stream_kept_alive(engine, make_client, monkeypatch):
    monkeypatch.setattr("api.responses.streaming.KEEPALIVE_SECONDS", 0.05)
    engine.hold([])
    async with make_client(REQUEST_TIMEOUT=0.3) as client:
        with anyio.fail_after(5):
            r = await client.post("/v1/responses", json={**BODY, "stream": True})
    events = events_of(r.text)
    assert [name for name, _ in events][-2:] == ["error", "response.failed"]
    assert events[-2][1]["code"] == "timeout" and events[-1][1]["response"]["error"]["code"] == "server_error"


async def test_admission_errors_keep_their_http_status_when_streaming(engine, client):
    engine.refuse(ipc.Error(status=429, message="queue full", code="queue_full"))
    r = await client.post("/v1/responses", json={**BODY, "stream": True})
    assert_error(r, 429, code="rate_limit_exceeded", type_="requests")
    assert r.headers["retry-after"] == "1"


async def test_in_progress_events_keep_a_long_prefill_alive(engine, client, monkeypatch):
    monkeypatch.setattr("api.responses.streaming.KEEPALIVE_SECONDS", 0.05)
    slow_prefill(engine, 0.4)
    events = events_of((await client.post("/v1/responses", json={**BODY, "stream": True})).text)
    names = [name for name, _ in events]
    assert names[:2] == ["response.created", "response.in_progress"] and names.count("response.in_progress") >= 4
    assert [n for n in names if n != "response.in_progress"][-1] == "response.completed"
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(("change", "param"), [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"background": True}, "background"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
])
async def test_stateful_and_unsupported_parameters_are_refused(engine, client, change, param):
    r = await client.post("/v1/responses", json={**BODY, **change})
    error = assert_error(r, 400, param=param, code="unsupported_parameter")
    assert "not supported" in error["message"]
    assert not engine.generates


async def test_previous_response_id_says_to_resend_the_conversation(engine, client):
    r = await client.post("/v1/responses", json={**BODY, "previous_response_id": "resp_1"})
    assert "resend the conversation in input" in r.json()["error"]["message"]


@pytest.mark.parametrize(("change", "param", "says"), [
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "send the item itself"),
    ({"input": [{"type": "computer_call_output", "call_id": "c", "output": {"type": "computer_screenshot"}}]},
     "input[0].type", "computer_call_output"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
     "input[0].content[0].image_url", "unsupported image format"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "input[0].content[0].type", "input_file"),
    ({"input": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}, "input[0].content[0].type",
     "input_text"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image"}]}]},
     "input[0].output[0].image_url", "image_url"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": {"a": 1}}]}, "input[0].output",
     "string"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id", "call_id"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id", "call_id"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{nope"}]},
     "input[0].arguments", "JSON"),
    ({"input": [{"type": "message", "role": "user"}]}, "input[0].content", "content"),
    ({"input": [{"type": "message", "content": "x"}]}, "input[0].role", "role"),
    ({"input": [{"content": "x"}]}, "input[0].type", "type"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "role"),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0].text", "text"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input", "no message"),
    ({"input": []}, "input", "no message"),
    ({"input": None}, "input", None),
    ({"tools": [{"type": "function", "parameters": WEATHER}]}, "tools[0].name", "name"),
    ({"tools": [FUNCTION, {**FUNCTION, "description": "again"}]}, "tools[1].name", "get_weather"),
    ({"tools": [{"type": "namespace", "tools": []}]}, "tools[0].name", "name"),
    ({"tools": [FUNCTION], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name", "nope"),
    ({"tools": [FUNCTION], "tool_choice": {"type": "function"}}, "tool_choice.name", "tool_choice.name"),
    ({"tools": [FUNCTION], "tool_choice": {"type": "web_search_preview"}}, "tool_choice.type", "hosted"),
    ({"tools": [{"type": "web_search"}], "tool_choice": "required"}, "tool_choice", "function tools"),
    ({"tools": [FUNCTION], "tool_choice": {"type": "allowed_tools", "mode": "auto",
                                           "tools": [{"type": "function", "name": "nope"}]}},
     "tool_choice.tools[0].name", "nope"),
    ({"text": {"format": {"type": "json_schema", "name": "w"}}}, "text.format.schema", "schema"),
    ({"text": {"format": {"type": "json_schema", "schema": WEATHER}}}, "text.format.name", "name"),
    ({"text": {"format": {"type": "grammar"}}}, "text.format.type", None),
    ({"temperature": 3}, "temperature", None),
    ({"top_logprobs": 21}, "top_logprobs", None),
    ({"max_output_tokens": 10**6}, "max_output_tokens", "limit"),
    ({"stream_options": {"include_obfuscation": False}}, "stream_options", "stream"),
    ({"truncation": "sometimes"}, "truncation", None),
    ({"model": None}, "model", None),
])
async def test_bad_requests_answer_openai_400_naming_the_parameter(engine, client, change, param, says):
    body = {k: v for k, v in {**BODY, **change}.items() if v is not None}
    r = await client.post("/v1/responses", json=body)
    error = assert_error(r, 400, param=param, type_="invalid_request_error")
    if says:
        assert says in error["message"]
    assert not engine.generates


async def test_unknown_model_is_404(engine, client):
    assert_error(await client.post("/v1/responses", json={**BODY, "model": "gpt-5"}), 404, param="model",
                 code="model_not_found")


async def test_too_many_input_items(engine, make_client):
    async with make_client(MAX_MESSAGES=2) as client:
        r = await client.post("/v1/responses", json={**BODY, "input": [{"role": "user", "content": "x"}] * 3})
    assert "MAX_MESSAGES" in assert_error(r, 400, param="input")["message"]


async def test_the_api_key_is_a_bearer_token(engine, make_client):
    async with make_client(API_KEY="sekret") as client:
        assert_error(await client.post("/v1/responses", json=BODY), 401, code="invalid_api_key")
        r = await client.post("/v1/responses", json=BODY, headers={"x-api-key": "sekret"})
        assert_error(r, 401, code="invalid_api_key")
        r = await client.post("/v1/responses", json=BODY, headers={"authorization": "Bearer sekret"})
        assert r.status_code == 200


async def test_an_engine_refusal_names_the_responses_parameters_not_chats(engine, client):
    engine.refuse(ipc.Error(status=400, code="kv_memory_exceeded", param="max_tokens", message=(
        "this request's KV cache would need ... (3 prompt + 5000 max_tokens, in steps of 256) ...; lower max_tokens, "
        "shorten the prompt or raise KV_MEMORY_BYTES")))
    r = await client.post("/v1/responses", json={**BODY, "max_output_tokens": 5000})
    error = assert_error(r, 400, code="kv_memory_exceeded", param="max_output_tokens")
    assert "5000 max_output_tokens" in error["message"] and "lower max_output_tokens" in error["message"]
    engine.refuse(ipc.Error(status=400, param="response_format", message="cannot enforce response_format: ..."))
    r = await client.post("/v1/responses", json=BODY)
    assert assert_error(r, 400, param="text.format")["message"] == "cannot enforce text.format: ..."
