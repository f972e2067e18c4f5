"""The official openai client's Responses API against the real engine and API on the demo model.

The demo model has random weights: its text is gibberish, and every valid call or JSON comes from
constrained decoding (a forced tool_choice, a json_schema format).
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.schemas import WEATHER

TOOL = {"type": "function", "name": "get_weather", "description": "Forecast", "parameters": WEATHER, "strict": True}
# what Codex sends: its MCP tools in a namespace, next to a hosted tool the model cannot run here
CALENDAR = {"type": "namespace", "name": "mcp__calendar", "description": "Plan events", "tools": [
    {"type": "function", "name": "create_event", "description": "Create an event.", "strict": False,
     "parameters": WEATHER}]}


def text_of(response) -> str:
    return "".join(part.text for item in response.output if item.type == "message" for part in item.content)


def calls_of(response) -> list:
    return [item for item in response.output if item.type == "function_call"]


def test_create_answers_a_response_with_usage(client):
    r = client.responses.create(model="default", input="hello", instructions="Be brief.", max_output_tokens=16,
                                temperature=0, store=True, metadata={"k": "v"})
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.status in ("completed", "incomplete") and r.output_text == text_of(r)
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 16
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.store is False and r.metadata == {"k": "v"}


def test_stream_events_in_order_and_the_final_response_equals_the_created_one(client):
    kw = dict(model="default", input="hello", max_output_tokens=24, temperature=0)
    created = client.responses.create(**kw)
    with client.responses.stream(**kw) as stream:
        events = list(stream)
    kinds = [ev.type for ev in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == f"response.{created.status}"
    # the terminal event's response (the SDK's get_final_response() wants response.completed only)
    final = events[-1].response
    assert [ev.sequence_number for ev in events] == list(range(len(events)))
    assert "".join(ev.delta for ev in events if ev.type == "response.output_text.delta") == text_of(final)
    assert text_of(final) == text_of(created) and final.status == created.status
    assert final.usage.output_tokens == created.usage.output_tokens
    assert [item.type for item in final.output] == [item.type for item in created.output]


def test_a_forced_function_call_validates_against_its_schema_and_its_output_goes_back(client):
    for seed in range(3):
        r = client.responses.create(model="default", input="hello", tools=[TOOL], max_output_tokens=80,
                                    tool_choice={"type": "function", "name": "get_weather"}, extra_body={"seed": seed})
        (call,) = calls_of(r)
        assert call.name == "get_weather" and call.call_id and call.id.startswith("fc_")
        jsonschema.validate(json.loads(call.arguments), WEATHER)

    def history(result: str) -> list:
        return [{"role": "user", "content": "hello"}, *[item.model_dump(exclude_none=True) for item in r.output],
                {"type": "function_call_output", "call_id": call.call_id, "output": result}]

    after = client.responses.create(model="default", input=history("sunny"), tools=[TOOL], tool_choice="none",
                                    max_output_tokens=8, temperature=0)
    assert after.status in ("completed", "incomplete") and after.usage.output_tokens > 0
    # the output reaches the prompt: a longer output is a longer prompt
    longer = client.responses.create(model="default", input=history("sunny and warm all week"), tools=[TOOL],
                                     tool_choice="none", max_output_tokens=1)
    assert longer.usage.input_tokens > after.usage.input_tokens


def test_a_json_schema_format_gives_json_that_matches_it(client):
    r = client.responses.create(model="default", input="weather?", max_output_tokens=60, extra_body={"seed": 3},
                                text={"format": {"type": "json_schema", "name": "weather", "schema": WEATHER,
                                                 "strict": True}})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), WEATHER)


def test_a_codex_shaped_request_calls_a_namespaced_tool(client):
    kw = dict(model="default", instructions="You are a coding agent.", max_output_tokens=80,
              input=[{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Rules."}]},
                     {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Lunch at 1"}]}],
              tools=[{"type": "web_search"}, CALENDAR], tool_choice="required", parallel_tool_calls=False,
              reasoning={"effort": "medium", "summary": "auto"}, store=False,
              include=["reasoning.encrypted_content"], prompt_cache_key="session-1",
              extra_body={"seed": 2, "client_metadata": {"x-codex-turn": "1"}})
    created = client.responses.create(**kw)
    (call,) = calls_of(created)
    assert (call.namespace, call.name) == ("mcp__calendar", "create_event")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    with client.responses.stream(**kw) as stream:
        done = [ev.item for ev in stream if ev.type == "response.output_item.done"]
        final = stream.get_final_response()
    assert [(i.type, getattr(i, "namespace", None), getattr(i, "arguments", None)) for i in done] == \
        [(i.type, getattr(i, "namespace", None), getattr(i, "arguments", None)) for i in final.output] == \
        [(i.type, getattr(i, "namespace", None), getattr(i, "arguments", None)) for i in created.output]
    # the call goes back as Codex sends it, namespace and all
    again = client.responses.create(**{**kw, "tool_choice": "auto", "max_output_tokens": 4, "input": [
        *kw["input"], call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "created"}]})
    assert again.status in ("completed", "incomplete")


@pytest.mark.parametrize(("change", "param"), [
    ({"previous_response_id": "resp_123"}, "previous_response_id"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]},
     "input[0].content[0].image_url"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
])
def test_bad_requests_are_400_in_openai_shape(client, change, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(**{"model": "default", "input": "hello", **change})
    assert info.value.status_code == 400
    assert info.value.body["param"] == param and info.value.body["type"] == "invalid_request_error"
    assert info.value.body["message"]


def test_greedy_output_with_a_tool_turn_equals_chat_completions(client):
    args = json.dumps({"city": "Paris", "days": 2})
    chat = client.chat.completions.create(model="default", max_tokens=24, temperature=0, messages=[
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ], tools=[{"type": "function", "function": {"name": "get_weather", "description": "Forecast",
                                                 "parameters": WEATHER, "strict": True}}])
    r = client.responses.create(model="default", max_output_tokens=24, temperature=0, instructions="You are terse.",
                                tools=[TOOL], input=[
                                    {"role": "user", "content": "hello"},
                                    {"type": "message", "role": "assistant",
                                     "content": [{"type": "output_text", "text": "Checking."}]},
                                    {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                                     "arguments": args},
                                    {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}])
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert text_of(r) == (chat.choices[0].message.content or "")
    assert [(c.name, json.loads(c.arguments)) for c in calls_of(r)] == \
        [(c.function.name, json.loads(c.function.arguments)) for c in chat.choices[0].message.tool_calls or []]


def test_a_forced_call_equals_the_chat_completions_one(client):
    chat = client.chat.completions.create(
        model="default", max_tokens=80, seed=4, messages=[{"role": "user", "content": "hello"}],
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}],
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    r = client.responses.create(model="default", max_output_tokens=80, input="hello", extra_body={"seed": 4},
                                tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER}],
                                tool_choice={"type": "function", "name": "get_weather"})
    (call,) = chat.choices[0].message.tool_calls
    assert [(c.name, c.arguments) for c in calls_of(r)] == [(call.function.name, call.function.arguments)]
    assert r.usage.output_tokens == chat.usage.completion_tokens
