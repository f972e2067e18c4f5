"""Tool calls and output text as real clients send and read them, on the real engine.

pydantic-based clients send nested models as `$defs`/`$ref` schemas; forced calls get cut by
max_tokens; tools come without parameters; clients rebuild text from logprobs bytes. The demo
model has random weights, so every valid call below comes from constrained decoding.
"""

from __future__ import annotations

import json
import re
from typing import Literal

import jsonschema
import openai
import pytest
from mlx_lm.tokenizer_utils import load
from pydantic import BaseModel, Field

from engine.rank0.output import OutputRules, TextSplitter
from tests.harness import MODEL_CACHE

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
FORCED = {"type": "function", "function": {"name": "get_weather"}}


def chat(client, **kw):
    return client.chat.completions.create(**{"model": "default", "messages": MESSAGES, "max_tokens": 80, **kw})


class Address(BaseModel):
    city: Literal["Paris", "Rome", "Oslo"]
    street: str = Field(max_length=12)


class Trip(BaseModel):
    """Plan a trip."""

    traveller: str = Field(max_length=12)
    home: Address
    stops: list[Address] = Field(max_length=2)


TRIP = openai.pydantic_function_tool(Trip)
PING = {"type": "function", "function": {"name": "ping", "description": "Check that the service is up"}}


def stream_text(client, **kw) -> tuple[str, list, str | None]:
    """Streamed content, tool-call deltas and the last finish_reason of one choice."""
    content, calls, finish = "", [], None
    for chunk in chat(client, stream=True, **kw):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        calls += delta.tool_calls or []
        finish = chunk.choices[0].finish_reason or finish
    return content, calls, finish


def test_the_openai_sdk_sends_a_nested_model_with_defs():
    assert "$defs" in TRIP["function"]["parameters"]  # what the openai SDK sends for a nested model


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "Trip"}}])
def test_a_forced_call_of_a_pydantic_tool_with_defs_is_a_valid_call(client, choice):
    for seed in range(3):
        r = chat(client, tools=[TRIP, *TOOLS], tool_choice=choice, temperature=1.0, seed=seed, max_tokens=300)
        message = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls"
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            if call.function.name == "Trip":
                jsonschema.validate(args, TRIP["function"]["parameters"])
                Trip.model_validate(args)
            else:
                assert (choice, call.function.name) == ("required", "get_weather")
                jsonschema.validate(args, WEATHER)


def test_streamed_pydantic_tool_calls_parse_into_the_model(client):
    content, deltas, finish = stream_text(client, tools=[TRIP], tool_choice="required", temperature=1.0, seed=7,
                                          max_tokens=300)
    assert finish == "tool_calls" and not content.strip()
    calls: dict[int, list[str]] = {}
    for d in deltas:
        name, args = calls.setdefault(d.index, ["", ""])
        calls[d.index] = [name + (d.function.name or ""), args + (d.function.arguments or "")]
    assert calls
    for name, args in calls.values():
        assert name == "Trip"
        Trip.model_validate_json(args)


def test_tools_with_defs_together_with_a_response_format(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "address", "schema": Address.model_json_schema()}}
    for seed in range(3):
        r = chat(client, tools=[TRIP], response_format=fmt, temperature=1.0, seed=seed, max_tokens=300)
        message = r.choices[0].message
        if message.tool_calls:
            Trip.model_validate_json(message.tool_calls[0].function.arguments)
        else:
            Address.model_validate_json(message.content)


def one_sentence(message: str) -> bool:
    return "\n" not in message and "%json" not in message and not re.search(r"\bstart:|<\[\d+\]>", message)


def test_a_tool_schema_that_cannot_be_enforced_is_a_400_naming_it(client):
    broken = {"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"item": {"$ref": "#/$defs/Missing"}}}}}
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, tools=[*TOOLS, PING, broken], tool_choice="required")
    body = err.value.body
    assert body["param"] == "tools[2].function.parameters"
    assert "tools[2].function.parameters" in body["message"] and "lookup" in body["message"]
    assert one_sentence(body["message"]) and len(body["message"]) < 400


def test_a_schema_no_value_satisfies_is_a_400_not_an_empty_answer(client):
    loop = {"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"}
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, response_format={"type": "json_schema", "json_schema": {"name": "loop", "schema": loop}})
    assert err.value.body["param"] == "response_format"
    assert one_sentence(err.value.body["message"])


def records_above_debug(stack) -> list[str]:
    """The engine's log records (continuation lines included) at INFO and above."""
    records: list[str] = []
    for path in [*sorted((stack.root / "logs").glob("*.log")), stack.procs["engine"].log]:
        for line in path.read_text(errors="replace").splitlines():
            head = re.match(r"\d{4}-\d\d-\d\d \S+ (?:rank\d+ )?([A-Z]+) ", line)
            if head:
                records.append(line if head.group(1) != "DEBUG" else "")
            elif records and records[-1]:
                records[-1] += "\n" + line
    return records


def test_client_schemas_and_text_stay_out_of_the_engine_log(client, stack):
    class Secret(BaseModel):
        zq_marker_city: str = Field(max_length=8)

    class Holder(BaseModel):
        zq_marker_inner: Secret

    schema = Holder.model_json_schema()
    fmt = {"type": "json_schema", "json_schema": {"name": "holder", "schema": schema}}
    chat(client, response_format=fmt, n=3, temperature=1.0, seed=1, max_tokens=200)
    chat(client, tools=[openai.pydantic_function_tool(Holder)], tool_choice="required", temperature=1.0, seed=1,
         max_tokens=200)
    with pytest.raises(openai.BadRequestError):
        chat(client, tools=[{"type": "function", "function": {"name": "zq_marker_bad", "parameters": {
            "$ref": "#/$defs/zq_marker_missing"}}}], tool_choice="required")
    leaked = [r for r in records_above_debug(stack) if "zq_marker" in r]
    assert not leaked, leaked[0][:300]


@pytest.mark.parametrize("max_tokens", [1, 3, 8])
def test_a_forced_call_cut_by_max_tokens_leaks_no_markup(client, max_tokens):
    kw = dict(tools=TOOLS, tool_choice=FORCED, temperature=1.0, seed=max_tokens, max_tokens=max_tokens)
    choice = chat(client, **kw).choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.tool_calls is None
    assert not choice.message.content  # null or "", never "<tool_call>{..."
    content, deltas, finish = stream_text(client, **kw)
    assert (content, deltas, finish) == ("", [], "length")


def test_a_required_call_cut_mid_arguments_leaks_no_markup(client):
    # the cut call comes back as a call (its name, the arguments so far), never as text
    for seed in range(3):
        kw = dict(tools=[TRIP], tool_choice="required", temperature=1.0, seed=seed, max_tokens=20)
        choice = chat(client, **kw).choices[0]
        (call,) = choice.message.tool_calls
        assert (choice.finish_reason, call.function.name) == ("length", "Trip")
        assert "<tool_call>" not in call.function.arguments and '"name"' not in call.function.arguments
        assert not choice.message.content
        content, deltas, finish = stream_text(client, **kw)
        assert (content, finish) == ("", "length") and len(deltas) == 1


def routed(text: str):
    """(content, calls) of a chat's text as rank 0's splitter routes it (the demo model's format)."""
    rules = OutputRules(load(sorted(MODEL_CACHE.glob("demo-tiny-*"))[-1]))
    splitter = TextSplitter(rules, rules.machine(chat=True, tools=True, stop=[]), "normal", TOOLS, True)
    piece, _ = splitter.feed(text)
    piece.add(splitter.finish())
    return piece.content, [(c.name, json.loads(c.arguments)) for c in piece.tool_calls]


def test_an_unclosed_call_becomes_a_call_only_when_it_parses(stack):  # the stack made the demo model
    assert routed('<tool_call>\n{"name": "get_weather", "arguments": {"ci') == ("", [])
    assert routed('Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}') == (
        "Sure.", [("get_weather", {"city": "Rome", "days": 2})])


def test_a_closed_call_whose_arguments_are_not_an_object_is_the_models_text(stack, caplog):
    # a client would run the tool with input {} (Anthropic, Ollama) or choke on the array: the text is what came
    for args in ('[1, 2]', '"Rome"', '7'):
        text = f'Sure.<tool_call>\n{{"name": "get_weather", "arguments": {args}}}\n</tool_call>'
        assert routed(text) == (text, [])
    assert "are not a JSON object" in caplog.text
    text = '<tool_call>\n{"name": "get_weather"}\n</tool_call>'  # no arguments at all: a call with none
    assert routed(text) == ("", [("get_weather", {})])


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "ping"}}])
def test_a_tool_without_parameters_is_called_with_no_arguments(client, choice):
    for seed in range(4):
        r = chat(client, tools=[PING], tool_choice=choice, temperature=1.0, seed=seed)
        calls = r.choices[0].message.tool_calls
        assert calls and all(c.function.name == "ping" for c in calls)
        assert [json.loads(c.function.arguments) for c in calls] == [{}] * len(calls)


def test_a_forced_weather_call_still_validates(client):
    r = chat(client, tools=[PING, *TOOLS], tool_choice=FORCED, temperature=1.0, seed=11)
    (call,) = r.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_chat_content_is_the_text_of_its_logprob_tokens(client):
    leading_space = 0
    for seed in range(16):
        kw = dict(temperature=1.0, seed=seed, max_tokens=4, logprobs=True)
        choice = chat(client, **kw).choices[0]
        raw = b"".join(bytes(t.bytes) for t in choice.logprobs.content)
        if b"<think>" in raw:
            continue  # reasoning is not content
        # invalid UTF-8 from a random model reads as U+FFFD in both
        assert choice.message.content == raw.decode("utf-8", "replace")
        assert stream_text(client, **{k: v for k, v in kw.items() if k != "logprobs"})[0] == choice.message.content
        leading_space += raw.startswith(b" ")
    assert leading_space  # the case mlx-lm's detokeniser used to trim


def test_a_legacy_completion_keeps_its_leading_space(client):
    leading_space = 0
    for seed in range(16):
        r = client.completions.create(model="default", prompt="Hello", max_tokens=4, temperature=1.0,
                                      seed=seed, logprobs=1)
        choice = r.choices[0]
        if "\ufffd" in choice.text:
            continue  # a character split across tokens has no exact per-token text
        assert choice.text == "".join(choice.logprobs.tokens)
        leading_space += choice.text.startswith(" ")
    assert leading_space
