"""Every dialect on two ranks spawned by mlx.launch: the same conversation (a tool turn included) gives the same
prompt and the same greedy tokens through chat completions, Anthropic's messages, Responses and Ollama's chat."""

from __future__ import annotations

import json

import anthropic
import ollama
import openai
import pytest

from tests.harness import Stack

pytestmark = pytest.mark.multirank

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
           "required": ["city"], "additionalProperties": False}
ARGS = json.dumps({"city": "Rome"})


def test_every_dialect_equals_chat_completions_on_two_ranks():
    s = Stack()
    engine = s.start_engine(ranks=2)
    api = s.start_api()
    client = openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0, timeout=120)
    try:
        assert s.probe()["ranks"] == 2
        chat = client.chat.completions.create(model="default", max_tokens=16, temperature=0, messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ], tools=[{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}])
        with client.responses.stream(model="default", max_output_tokens=16, temperature=0, input=[
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": ARGS},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        ], tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER}]) as stream:
            response = list(stream)[-1].response
        text = "".join(p.text for item in response.output if item.type == "message" for p in item.content)
        assert text == (chat.choices[0].message.content or "")
        assert response.usage.input_tokens == chat.usage.prompt_tokens

        with anthropic.Anthropic(base_url=s.base_url, api_key="x", max_retries=0, timeout=120) as claude:
            m = claude.messages.create(model="default", max_tokens=16, extra_body={"temperature": 0}, messages=[
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather",
                                                   "input": json.loads(ARGS)}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"}]},
            ], tools=[{"name": "get_weather", "input_schema": WEATHER}])
        assert "".join(b.text for b in m.content if b.type == "text") == (chat.choices[0].message.content or "")
        assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == chat.usage.prompt_tokens

        plain = client.chat.completions.create(model="default", max_tokens=16, temperature=0,
                                               messages=[{"role": "system", "content": "Be brief."},
                                                         {"role": "user", "content": "hi"}])
        with ollama.Client(host=s.base_url, timeout=120) as local:
            o = local.chat(model="default", options={"temperature": 0, "num_predict": 16},
                           messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
        assert o.message.content == (plain.choices[0].message.content or "")
        assert o.prompt_eval_count == plain.usage.prompt_tokens

        forced = client.chat.completions.create(
            model="default", max_tokens=80, seed=3, messages=[{"role": "user", "content": "hi"}],
            tools=[{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}],
            tool_choice="required").choices[0].message.tool_calls[0].function
        r = client.responses.create(model="default", max_output_tokens=80, input="hi", extra_body={"seed": 3},
                                    tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER}],
                                    tool_choice="required")
        assert [(c.name, c.arguments) for c in r.output if c.type == "function_call"] == \
            [(forced.name, forced.arguments)]
        assert s.probe() is not None  # no desync ended the engine
    finally:
        client.close()
        api.stop()
        engine.stop()
