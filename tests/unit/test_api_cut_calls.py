"""A tool call the engine reports cut by max_tokens (partial, finish "length"), in each dialect's own shape,
streamed and not, against a fake engine speaking the real wire protocol."""

from __future__ import annotations

import json

import pytest

import ipc
from ipc.messages import ToolCall
from tests.unit.named_events import events_of, play

pytestmark = pytest.mark.anyio

WRITTEN = '{"city": "Paris", "days": [1, 2'  # the arguments when max_tokens struck
SO_FAR = {"city": "Paris", "days": [1, 2]}  # the values written whole, as an object
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
USER = [{"role": "user", "content": "Hi"}]


def cut(engine) -> None:
    call = ToolCall(id="call_abc", name="get_weather", arguments=WRITTEN, partial=True)
    play(engine, ipc.Delta(request_id="", text="", completion_tokens=0),
         ipc.Finish(request_id="", finish_reason="length", prompt_tokens=7, completion_tokens=16, tool_calls=[call]))


async def test_chat_says_length_with_the_call_and_its_arguments_so_far(engine, client):
    cut(engine)
    body = {"model": "test-model", "messages": USER, "tools": [TOOL], "tool_choice": "required"}
    choice = (await client.post("/v1/chat/completions", json=body)).json()["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] is None
    assert choice["message"]["tool_calls"] == [
        {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": WRITTEN}}]
    r = await client.post("/v1/chat/completions", json={**body, "stream": True})
    chunks = [json.loads(line[6:]) for line in r.text.split("\n\n") if line.startswith("data: {")]
    deltas = [d for c in chunks for d in c["choices"][0]["delta"].get("tool_calls", [])]
    assert [(d["function"]["name"], d["function"]["arguments"]) for d in deltas] == [("get_weather", WRITTEN)]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_anthropic_says_max_tokens_with_the_partial_tool_use_block(engine, client):
    cut(engine)
    body = {"model": "test-model", "max_tokens": 16, "messages": USER, "tool_choice": {"type": "any"},
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]}
    message = (await client.post("/v1/messages", json=body)).json()
    assert message["stop_reason"] == "max_tokens"
    assert message["content"] == [{"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": SO_FAR}]
    events = events_of((await client.post("/v1/messages", json={**body, "stream": True})).text)
    starts = [e["content_block"] for name, e in events if name == "content_block_start"]
    assert starts == [{"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {}}]
    assert [e["delta"] for name, e in events if name == "content_block_delta"] == [
        {"type": "input_json_delta", "partial_json": WRITTEN}]
    assert [e["delta"]["stop_reason"] for name, e in events if name == "message_delta"] == ["max_tokens"]


async def test_responses_is_incomplete_with_an_incomplete_function_call(engine, client):
    cut(engine)
    body = {"model": "test-model", "input": "Hi", "tool_choice": "required",
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]}
    response = (await client.post("/v1/responses", json=body)).json()
    assert (response["status"], response["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    (item,) = response["output"]
    assert (item["type"], item["name"], item["arguments"], item["status"]) == (
        "function_call", "get_weather", WRITTEN, "incomplete")
    events = events_of((await client.post("/v1/responses", json={**body, "stream": True})).text)
    assert [e["delta"] for name, e in events if name == "response.function_call_arguments.delta"] == [WRITTEN]
    assert events[-1][0] == "response.incomplete"
    assert events[-1][1]["response"]["output"][0]["status"] == "incomplete"


@pytest.mark.parametrize("stream", [False, True])
async def test_ollama_says_length_with_the_call_and_the_arguments_written_whole(engine, client, stream):
    cut(engine)
    body = {"model": "test-model", "messages": USER, "tools": [TOOL], "stream": stream}
    r = await client.post("/api/chat", json=body)
    lines = [json.loads(line) for line in r.text.splitlines()]
    calls = [c for line in lines for c in line["message"].get("tool_calls", [])]
    assert calls == [{"id": "call_abc", "function": {"index": 0, "name": "get_weather", "arguments": SO_FAR}}]
    assert lines[-1]["done"] and lines[-1]["done_reason"] == "length"
