"""The official anthropic client against the real engine and API on the demo model.

The demo model has random weights: its text is gibberish, and every valid tool call comes from
constrained decoding.
"""

from __future__ import annotations

import json
from typing import Literal

import anthropic
import jsonschema
import pydantic
import pytest

from tests.schemas import WEATHER

MESSAGES = [{"role": "user", "content": "hello"}]
# this SDK's create() no longer names temperature; the API still takes it
GREEDY = {"temperature": 0}
TOOLS = [{"name": "get_weather", "description": "Forecast", "input_schema": WEATHER}]


@pytest.fixture(scope="module")
def claude(stack):
    with anthropic.Anthropic(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def prompt_of(message) -> int:
    """The whole prompt: what was computed and what the prefix cache held."""
    return message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)


def text_of(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def test_create_answers_a_message_with_usage(claude):
    m = claude.messages.create(model="default", max_tokens=16, messages=MESSAGES, extra_body=GREEDY,
                               system=[{"type": "text", "text": "x-anthropic-billing-header: cc_version=1;"},
                                       {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
                               metadata={"user_id": "u"})
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant"
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.input_tokens > 0 and 0 < m.usage.output_tokens <= 16


def test_stream_events_in_order_and_text_equals_the_final_message(claude):
    full = claude.messages.create(model="default", max_tokens=24, messages=MESSAGES, extra_body=GREEDY)
    with claude.messages.stream(model="default", max_tokens=24, messages=MESSAGES, extra_body=GREEDY) as stream:
        kinds = [ev.type for ev in stream if not ev.type.endswith(("text", "input_json", "thinking", "signature"))]
        final = stream.get_final_message()
    assert kinds[0] == "message_start"
    assert kinds[-2:] == ["message_delta", "message_stop"]
    body = kinds[1:-2]
    assert body.count("content_block_start") == body.count("content_block_stop") >= 1
    assert set(body) <= {"ping", "content_block_start", "content_block_delta", "content_block_stop"}
    assert text_of(final) == text_of(full)
    assert final.stop_reason == full.stop_reason and final.usage.output_tokens == full.usage.output_tokens


def test_a_forced_tool_use_validates_against_its_schema(claude):
    for seed in range(3):
        m = claude.messages.create(model="default", max_tokens=80, messages=MESSAGES, tools=TOOLS,
                                   tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"seed": seed})
        assert m.stop_reason == "tool_use"
        (use,) = [b for b in m.content if b.type == "tool_use"]
        assert use.id.startswith("toolu_") and use.name == "get_weather"
        jsonschema.validate(use.input, WEATHER)


def test_a_tool_result_round_trip(claude):
    m = claude.messages.create(model="default", max_tokens=80, messages=MESSAGES, tools=TOOLS,
                               tool_choice={"type": "any"}, extra_body={"seed": 1})
    (use,) = [b for b in m.content if b.type == "tool_use"]

    def history(result: str) -> list:
        return [*MESSAGES, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": result}]}]

    after = claude.messages.create(model="default", max_tokens=8, messages=history("sunny"), tools=TOOLS,
                                   tool_choice={"type": "none"}, extra_body=GREEDY)
    assert after.stop_reason in ("end_turn", "max_tokens") and after.usage.output_tokens > 0
    # the result reaches the prompt: a longer result is a longer prompt
    longer = claude.messages.count_tokens(model="default", messages=history("sunny and warm all week"), tools=TOOLS,
                                          tool_choice={"type": "none"})
    assert longer.input_tokens > prompt_of(after)


def test_count_tokens_is_the_prompt_of_create(claude):
    counted = claude.messages.count_tokens(model="default", messages=MESSAGES, tools=TOOLS)
    m = claude.messages.create(model="default", max_tokens=1, messages=MESSAGES, tools=TOOLS)
    assert counted.input_tokens == prompt_of(m) > 0


def test_a_bad_request_is_a_400_in_anthropic_shape(claude):
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(model="default", max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    assert info.value.status_code == 400
    assert info.value.body["type"] == "error"
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert "image" in info.value.body["error"]["message"]


def test_greedy_output_equals_chat_completions(claude, client):
    system, user = "You are terse.", "Name a colour."
    chat = client.chat.completions.create(model="default", max_tokens=24, temperature=0, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": user}])
    m = claude.messages.create(model="default", max_tokens=24, extra_body=GREEDY, system=system,
                               messages=[{"role": "user", "content": [{"type": "text", "text": user}]}])
    assert prompt_of(m) == chat.usage.prompt_tokens
    assert m.usage.output_tokens == chat.usage.completion_tokens
    assert text_of(m) == chat.choices[0].message.content


def test_greedy_output_with_tool_turns_equals_chat_completions(claude, client):
    call = {"city": "Paris", "days": 2}
    chat = client.chat.completions.create(model="default", max_tokens=24, temperature=0, messages=[
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(call)}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
    ], tools=[{"type": "function", "function": {"name": "get_weather", "description": "Forecast",
                                                 "parameters": WEATHER}}])
    m = claude.messages.create(model="default", max_tokens=24, extra_body=GREEDY, tools=TOOLS, messages=[
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": call}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]},
    ])
    assert prompt_of(m) == chat.usage.prompt_tokens
    assert m.usage.output_tokens == chat.usage.completion_tokens
    assert text_of(m) == (chat.choices[0].message.content or "")
    uses = [(b.name, b.input) for b in m.content if b.type == "tool_use"]
    assert uses == [(c.function.name, json.loads(c.function.arguments)) for c in chat.choices[0].message.tool_calls or []]


def test_a_streamed_tool_use_equals_the_created_one(claude):
    kw = dict(model="default", max_tokens=80, messages=MESSAGES, tools=TOOLS,
              tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"seed": 7})
    created = claude.messages.create(**kw)
    with claude.messages.stream(**kw) as stream:
        kinds = [ev.type for ev in stream]
        final = stream.get_final_message()
    assert "content_block_start" in kinds and kinds[-1] == "message_stop"
    assert final.stop_reason == created.stop_reason == "tool_use"
    assert [(b.type, getattr(b, "input", None)) for b in final.content] == \
        [(b.type, getattr(b, "input", None)) for b in created.content]
    jsonschema.validate(final.content[-1].input, WEATHER)


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_sequence_that_appears_ends_the_message_and_is_named(claude, stream):
    kw = dict(model="default", max_tokens=24, messages=MESSAGES, extra_body=GREEDY)
    full = text_of(claude.messages.create(**kw))
    # a piece of the greedy text after its start, without surrounding whitespace
    stop = next(full[i:i + 3] for i in range(2, len(full) - 3) if full[i:i + 3] == full[i:i + 3].strip())
    kw["stop_sequences"] = ["never in this text", stop]
    if stream:
        with claude.messages.stream(**kw) as events:
            m = events.get_final_message()
    else:
        m = claude.messages.create(**kw)
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", stop)
    assert text_of(m) == full[:full.index(stop)]


def test_a_stop_sequence_that_never_appears_is_not_named(claude):
    m = claude.messages.create(model="default", max_tokens=8, messages=MESSAGES, extra_body=GREEDY,
                               stop_sequences=["never in this text"])
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None


class Forecast(pydantic.BaseModel):
    city: Literal["Paris", "Rome", "Oslo"]
    sunny: bool
    unit: Literal["celsius", "fahrenheit"]


def test_messages_parse_gives_the_model_it_asked_for(claude):
    # what messages.parse(output_format=...) and langchain-anthropic's json_schema structured output send
    for seed in range(3):
        m = claude.messages.parse(model="default", max_tokens=80, messages=MESSAGES, output_format=Forecast,
                                  extra_body={"seed": seed, "temperature": 1.0})
        assert m.stop_reason == "end_turn"
        assert isinstance(m.parsed_output, Forecast)


def test_output_config_streamed_equals_created_and_a_bad_schema_is_a_400(claude):
    # no additionalProperties: Anthropic reads the object as closed
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "cold": {"type": "boolean"}}}
    kw = dict(model="default", max_tokens=80, messages=MESSAGES, extra_body={"seed": 4, "temperature": 1.0},
              output_config={"format": {"type": "json_schema", "schema": schema}})
    full = claude.messages.create(**kw)
    with claude.messages.stream(**kw) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text_of(full) and final.stop_reason == full.stop_reason == "end_turn"
    doc = json.loads(streamed)
    assert set(doc) <= {"city", "cold"}
    jsonschema.validate(doc, schema)
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(**{**kw, "output_config": {"format": {"type": "json_schema", "schema": {
            "type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}}})
    assert "output_config.format" in err.value.message
