"""Tools on a model whose chat template has no tool syntax (the demo model under SmolLM2's plain ChatML): the tools
are described in the system message, and a forced tool_choice is enforced in the JSON envelope and parsed."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.harness import serving, short_dir
from tests.plain_chatml import plain_chatml_model

WEATHER = {"type": "object", "properties": {"location": {"type": "string"},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["location", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def plain(demo_tiny):
    with serving(str(plain_chatml_model(demo_tiny, short_dir("chatml-") / "model"))) as served:
        yield served


def test_a_forced_call_names_the_right_function_with_arguments_its_schema_accepts(plain):
    _, client = plain
    for choice, names in (("required", {"get_weather", "get_time"}),
                          ({"type": "function", "function": {"name": "get_weather"}}, {"get_weather"})):
        r = client.chat.completions.create(model="default", messages=ASK, tools=TOOLS, tool_choice=choice,
                                           max_tokens=200, temperature=0)
        (call,) = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and call.function.name in names
        schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == call.function.name)
        jsonschema.validate(json.loads(call.function.arguments), schema)


def test_the_tools_and_a_historys_calls_reach_the_prompt(plain):
    stack, client = plain
    without = client.chat.completions.create(model="default", messages=ASK, max_tokens=1)
    with_tools = client.chat.completions.create(model="default", messages=ASK, tools=TOOLS, max_tokens=1)
    tokenized = httpx.post(stack.base_url + "/tokenize", json={"messages": ASK, "tools": TOOLS,
                                                                "return_token_strs": True}).json()
    assert with_tools.usage.prompt_tokens == tokenized["count"] > without.usage.prompt_tokens + 50
    assert "get_weather" in "".join(tokenized["token_strs"]).replace("\u0120", " ")
    turn = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"location": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}]
    after = client.chat.completions.create(model="default", messages=turn, tools=TOOLS, max_tokens=8)
    assert after.usage.prompt_tokens > with_tools.usage.prompt_tokens + 20
    assert after.choices[0].finish_reason in ("stop", "length", "tool_calls")
