"""The gateway's OpenAI shapes for reasoning, tool calls, logprobs and n > 1, against a scripted engine."""

from __future__ import annotations

import json

import pytest

import ipc
from ipc.messages import TokenLogprob, ToolCall, TopLogprob

pytestmark = pytest.mark.anyio

CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "Hi"}]}
CALL = ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def script(events):
    """Started, then the given events (built from the Generate by each callable)."""

    async def play(conn: ipc.FramedStream, msg: ipc.Generate) -> None:
        await conn.send(ipc.Started(request_id=msg.request_id, prompt_tokens=5))
        for make in events:
            await conn.send(make(msg.request_id))

    return play


def delta(text="", **kw):
    return lambda rid: ipc.Delta(request_id=rid, text=text, completion_tokens=kw.pop("tokens", 1), **kw)


def finish(reason="stop", tokens=3, **kw):
    return lambda rid: ipc.Finish(request_id=rid, finish_reason=reason, prompt_tokens=5, completion_tokens=tokens, **kw)


async def sse(client, body):
    async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = [line.removeprefix("data: ") async for line in r.aiter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


REASONING = [delta(reasoning="Think"), delta(reasoning="ing."), delta("Answer", tokens=3), finish(tokens=4)]


async def test_reasoning_is_reasoning_content_and_reasoning(engine, client):
    engine.script = script(REASONING)
    message = (await client.post("/v1/chat/completions", json=CHAT)).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Answer", "refusal": None,
                       "reasoning_content": "Thinking.", "reasoning": "Thinking."}
    chunks = await sse(client, CHAT)
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""},
        {"reasoning_content": "Think", "reasoning": "Think"},
        {"reasoning_content": "ing.", "reasoning": "ing."},
        {"content": "Answer"},
        {},
    ]


async def test_tool_calls_and_their_finish_reason(engine, client):
    engine.script = script([delta(tool_calls=[CALL]), finish(tool_calls=[CALL.__class__(
        id="call_2", name="get_weather", arguments="{}")])])
    body = {**CHAT, "tools": TOOLS}
    choice = (await client.post("/v1/chat/completions", json=body)).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert choice["message"]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
    ]
    chunks = await sse(client, body)
    assert [c["choices"][0]["delta"].get("tool_calls") for c in chunks[1:3]] == [
        [{"index": 0, "id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}],
        [{"index": 1, "id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}],
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_a_length_cut_stays_length_with_tool_calls(engine, client):
    engine.script = script([delta(tool_calls=[CALL]), finish("length")])
    r = await client.post("/v1/chat/completions", json={**CHAT, "tools": TOOLS})
    assert r.json()["choices"][0]["finish_reason"] == "length"


async def test_engine_gets_tools_choice_schema_and_thinking_switch(engine, client):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    await client.post("/v1/chat/completions", json={
        **CHAT, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False, "reasoning_effort": "none",
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        "messages": [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
            {"role": "tool", "tool_call_id": "c", "content": "sunny"}]})
    (msg,) = engine.generates
    assert msg.tools == TOOLS
    assert msg.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert msg.parallel_tool_calls is False and msg.enable_thinking is False and msg.json_schema == schema
    # templates get arguments as a mapping and content as text
    assert msg.messages[0]["content"] == ""
    assert msg.messages[0]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}


@pytest.mark.parametrize(("effort", "switch", "level"), [
    ("none", False, ""), ("minimal", None, "minimal"), ("low", None, "low"), ("medium", None, "medium"),
    ("high", None, "high"), ("xhigh", None, "xhigh"), ("max", None, "max"), (None, None, ""),
])
async def test_reasoning_effort_levels_reach_the_engine(engine, client, effort, switch, level):
    # cline --thinking low sends "low", which used to be a 400
    r = await client.post("/v1/chat/completions", json={**CHAT, "reasoning_effort": effort})
    assert r.status_code == 200, r.text
    (msg,) = engine.generates
    assert msg.enable_thinking is switch and msg.reasoning_effort == level


async def test_an_unknown_reasoning_effort_is_a_400_naming_it(engine, client):
    r = await client.post("/v1/chat/completions", json={**CHAT, "reasoning_effort": "turbo"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_effort", r.text
    assert "low" in r.json()["error"]["message"] and not engine.generates


async def test_json_object_becomes_any_object(engine, client):
    await client.post("/v1/chat/completions", json={**CHAT, "response_format": {"type": "json_object"}})
    assert engine.generates[0].json_schema == {"type": "object"}


LP = TokenLogprob(token="Hi", logprob=-0.5, bytes=[72, 105], top=[
    TopLogprob(token="Hi", logprob=-0.5, bytes=[72, 105]), TopLogprob(token="Yo", logprob=-1.5, bytes=[89, 111])])


async def test_chat_logprobs_shape(engine, client):
    engine.script = script([delta("Hi", logprobs=[LP]), finish(tokens=1)])
    r = await client.post("/v1/chat/completions", json={**CHAT, "logprobs": True, "top_logprobs": 2})
    assert engine.generates[0].params.logprobs and engine.generates[0].params.top_logprobs == 2
    assert r.json()["choices"][0]["logprobs"] == {"content": [{
        "token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": [
            {"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}, {"token": "Yo", "logprob": -1.5, "bytes": [89, 111]}],
    }], "refusal": None}


async def test_completion_logprobs_shape(engine, client):
    engine.script = script([delta("Hi", logprobs=[LP]), finish(tokens=1, logprobs=[LP])])
    r = await client.post("/v1/completions", json={"model": "test-model", "prompt": "x", "logprobs": 2})
    assert r.json()["choices"][0]["logprobs"] == {
        "tokens": ["Hi", "Hi"], "token_logprobs": [-0.5, -0.5],
        "top_logprobs": [{"Hi": -0.5, "Yo": -1.5}] * 2, "text_offset": [0, 2]}


async def test_n_choices_arrive_interleaved_and_are_told_apart(engine, client):
    engine.script = script([delta("a", index=0), delta("b", index=1), finish(index=1, tokens=2, text="B"),
                            finish(index=0, tokens=4, text="A")])
    body = {**CHAT, "n": 2}
    r = (await client.post("/v1/chat/completions", json=body)).json()
    assert [(c["index"], c["message"]["content"]) for c in r["choices"]] == [(0, "aA"), (1, "bB")]
    assert r["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11,
                          "prompt_tokens_details": {"cached_tokens": 0}}
    chunks = await sse(client, {**body, "stream_options": {"include_usage": True}})
    assert [c["choices"][0]["index"] for c in chunks[:2]] == [0, 1]  # a role chunk for each choice
    assert chunks[-1]["usage"]["completion_tokens"] == 6
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1] if c["choices"][0]["finish_reason"]] == [
        "stop", "stop"]
