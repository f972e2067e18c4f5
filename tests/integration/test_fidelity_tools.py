"""Tool calls and structured output with the official client on the real engine.

The demo model has random weights: every valid call or JSON document below comes from constrained
decoding, which is the point.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.schemas import UNIT, weather_schema

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = weather_schema(unit=UNIT)
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Forecast", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}}, "required": ["zone"],
        "additionalProperties": False}}},
]
FORCED = {"type": "function", "function": {"name": "get_weather"}}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "active"],
    "additionalProperties": False,
}


def chat(client, **kw):
    return client.chat.completions.create(**{"model": "default", "messages": MESSAGES, "max_tokens": 80, **kw})


def calls_of(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def test_a_named_tool_choice_is_a_valid_call_of_that_function(client):
    for seed in range(5):
        r = chat(client, tools=TOOLS, tool_choice=FORCED, temperature=1.0, seed=seed)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_streamed_tool_call_deltas_reassemble_to_the_non_streamed_result(client):
    kw = dict(tools=TOOLS, tool_choice="required", temperature=1.0, seed=3, max_tokens=200)
    full = chat(client, **kw).choices[0]
    chunks = list(chat(client, stream=True, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for d in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = d.id or call["id"]
            call["name"] += d.function.name or ""
            call["arguments"] += d.function.arguments or ""
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == calls_of(full.message)
    assert all(c["id"] for c in calls.values())
    assert chunks[-1].choices[0].finish_reason == full.finish_reason == "tool_calls"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks).strip()
    for name, args in calls_of(full.message):
        jsonschema.validate(args, WEATHER if name == "get_weather" else TOOLS[1]["function"]["parameters"])


def test_parallel_tool_calls_false_gives_exactly_one_call(client):
    for seed in range(3):
        r = chat(client, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=seed)
        assert len(r.choices[0].message.tool_calls) == 1


def test_content_streams_unbuffered_when_tools_are_present(client):
    kw = dict(tools=TOOLS, temperature=0, max_tokens=24)
    full = chat(client, **kw).choices[0]
    assert full.message.tool_calls is None and full.finish_reason == "length"
    pieces = [c.choices[0].delta.content for c in chat(client, stream=True, **kw) if c.choices[0].delta.content]
    assert len(pieces) > 10  # token by token, not one block at the end
    assert "".join(pieces) == full.message.content and "<tool_call>" not in full.message.content


def test_tool_choice_none_and_tool_results_are_accepted(client):
    r = chat(client, tools=TOOLS, tool_choice="none", max_tokens=8)
    assert r.choices[0].message.tool_calls is None
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"forecast": "sunny"}'},
    ]
    r = client.chat.completions.create(model="default", messages=history, tools=TOOLS, max_tokens=8)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_a_tool_choice_naming_an_unknown_function_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert err.value.body["param"] == "tool_choice"


def test_json_schema_output_parses_and_validates_20_times_out_of_20(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    docs = []
    for seed in range(4):
        r = chat(client, response_format=fmt, n=5, temperature=1.0, seed=100 * seed, max_tokens=120)
        for choice in r.choices:
            assert choice.finish_reason == "stop"
            docs.append(json.loads(choice.message.content))
    assert len(docs) == 20
    for doc in docs:
        jsonschema.validate(doc, PERSON)
    assert len({json.dumps(d) for d in docs}) > 10  # sampled, not one forced answer
    streamed = "".join(c.choices[0].delta.content or "" for c in chat(
        client, response_format=fmt, temperature=1.0, seed=0, max_tokens=120, stream=True))
    jsonschema.validate(json.loads(streamed), PERSON)


def test_json_object_output_is_a_json_object(client):
    r = chat(client, response_format={"type": "json_object"}, temperature=1.0, seed=1, max_tokens=400)
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_auto_with_a_response_format_answers_json_or_calls_tools(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    for seed in range(3):
        r = chat(client, tools=TOOLS, response_format=fmt, temperature=1.0, seed=seed, max_tokens=200)
        message = r.choices[0].message
        if message.tool_calls:
            assert all(name in ("get_weather", "get_time") for name, _ in calls_of(message))
        else:
            jsonschema.validate(json.loads(message.content), PERSON)


def test_stop_strings_with_a_forced_call_never_cut_it(client):
    # smolagents' ToolCallingAgent sends these stop strings with every forced call
    r = chat(client, tools=TOOLS, tool_choice="required", stop=["Observation:", "Calling tools:"], temperature=1.0,
             seed=0, max_tokens=200)
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.tool_calls
    # a stop string every call of get_weather contains: constrained output is never cut by one
    for seed in range(3):
        r = chat(client, tools=TOOLS, tool_choice=FORCED, stop=['"city"', "}"], temperature=1.0, seed=seed,
                 max_tokens=200)
        assert r.choices[0].finish_reason == "tool_calls"
        ((name, args),) = calls_of(r.choices[0].message)
        assert name == "get_weather"
        jsonschema.validate(args, WEATHER)


def test_stop_strings_with_a_response_format_never_cut_the_json(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    for stream in (False, True):
        kw = dict(response_format=fmt, stop=[": ", '"name"'], temperature=1.0, seed=5, max_tokens=120)
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in chat(client, stream=True, **kw))
        else:
            r = chat(client, **kw)
            assert r.choices[0].finish_reason == "stop"
            text = r.choices[0].message.content
        jsonschema.validate(json.loads(text), PERSON)
