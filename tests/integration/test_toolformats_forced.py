"""Forced calls on the zoo models that speak gpt-oss harmony, DeepSeek V3.1's markup and V3.2's DSML, on one rank.

Random weights write a valid call only under the grammar, which writes each family's own envelope: the answer
has calls whose arguments hold to the tool's schema, through chat completions and messages, streamed or not.
"""

from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest

from tests.harness import Stack, assert_engine_logs_clean
from tests.schemas import WEATHER

CLOCK = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"],
         "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Forecast", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Clock", "parameters": CLOCK}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": CLOCK}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
# DSML's markup is text to the zoo's 1,024-token vocabulary: a whole call takes about 165 tokens there
MAX_TOKENS = 300


@pytest.fixture(scope="module", params=["gpt-oss-harmony", "deepseek-v3.1-tools", "deepseek-v3.2-tools"])
def served(request):
    stack = Stack(extra={"MODEL": "zoo-" + request.param})
    engine = stack.start_engine()
    api = stack.start_api()
    yield stack
    api.stop()
    engine.stop()
    assert_engine_logs_clean(stack)


@pytest.fixture(scope="module")
def client(served):
    openai = pytest.importorskip("openai")
    with openai.OpenAI(base_url=served.base_url + "/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def claude(served):
    with anthropic.Anthropic(base_url=served.base_url, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def _calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def _streamed(client, **kw) -> tuple[str | None, list[tuple[str, dict]], str]:
    """(content, calls, finish_reason) put together from the chunks of a streamed chat completion."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for d in choice.delta.tool_calls or []:
                name, args = calls.get(d.index, ("", ""))
                calls[d.index] = (name + (d.function.name or ""), args + (d.function.arguments or ""))
            finish = choice.finish_reason or finish
    return content or None, [(n, json.loads(a)) for _, (n, a) in sorted(calls.items())], finish


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_a_forced_call_holds_to_its_schema_and_streams_alike(client, choice) -> None:
    for seed in range(3):
        kw = dict(model="default", messages=MESSAGES, tools=TOOLS, tool_choice=choice, max_tokens=MAX_TOKENS, seed=seed,
                  parallel_tool_calls=False)
        reply = client.chat.completions.create(**kw)
        message = reply.choices[0].message
        calls = _calls(message)
        assert reply.choices[0].finish_reason == "tool_calls" and len(calls) == 1, message
        name, args = calls[0]
        assert name == "get_time" if isinstance(choice, dict) else name in SCHEMAS
        jsonschema.validate(args, SCHEMAS[name])
        assert not message.content  # no markup of the envelope
        assert _streamed(client, **kw) == (message.content or None, calls, "tool_calls")


def test_a_forced_tool_use_in_messages_holds_to_its_schema_and_streams_alike(claude) -> None:
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        kw = dict(model="default", max_tokens=MAX_TOKENS, messages=MESSAGES, tools=tools, tool_choice=choice,
                  extra_body={"seed": 5})
        created = claude.messages.create(**kw)
        with claude.messages.stream(**kw) as stream:
            final = stream.get_final_message()
        assert final.stop_reason == created.stop_reason == "tool_use"
        uses = [(b.name, b.input) for b in created.content if b.type == "tool_use"]
        assert uses == [(b.name, b.input) for b in final.content if b.type == "tool_use"] and len(uses) == 1
        assert not [b for b in created.content if b.type == "text" and b.text.strip()]
        name, args = uses[0]
        assert choice["type"] == "any" or name == "get_weather"
        jsonschema.validate(args, SCHEMAS[name])


def test_response_format_is_the_answer_s_content(client) -> None:
    """Constrained JSON is the answer, not a channel header nor reasoning, whatever the prompt leaves open."""
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER}}
    for seed in range(3):
        reply = client.chat.completions.create(model="default", messages=MESSAGES, response_format=fmt,
                                               max_tokens=60, seed=seed)
        jsonschema.validate(json.loads(reply.choices[0].message.content), WEATHER)
