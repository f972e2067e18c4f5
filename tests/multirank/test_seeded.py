"""Same seed, same output on one rank and on two: sampling, n > 1 and grammar masks run on every rank."""

from __future__ import annotations

import json

import openai
import pytest

from tests.harness import Stack

pytestmark = pytest.mark.multirank

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer", "minimum": 0,
                                                                        "maximum": 99}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}, "required": ["city"]}}}]


def outputs(ranks: int) -> dict:
    """The seeded answers of one engine with `ranks` ranks."""
    s = Stack()
    engine = s.start_engine(ranks=ranks)
    api = s.start_api()
    client = openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0, timeout=120)

    def chat(**kw):
        return client.chat.completions.create(
            **{"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 24,
               "temperature": 1.0, **kw})

    try:
        out = {f"seed {seed}": chat(seed=seed).choices[0].message.content for seed in (1, 2, 3)}
        out["n=3"] = [c.message.content for c in chat(seed=9, n=3).choices]
        out["json"] = chat(seed=4, max_tokens=60, response_format={
            "type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}).choices[0].message.content
        call = chat(seed=5, max_tokens=60, tools=TOOLS, tool_choice="required").choices[0].message.tool_calls[0]
        out["tool"] = (call.function.name, call.function.arguments)
        out["logprobs"] = [(e.token, round(e.logprob, 3)) for e in
                           chat(seed=6, max_tokens=8, logprobs=True).choices[0].logprobs.content]
        assert s.probe() is not None  # no desync ended the engine
        return out
    finally:
        client.close()
        api.stop()
        engine.stop()


def test_seeded_outputs_match_across_rank_counts():
    one, two = outputs(1), outputs(2)
    json.loads(one["json"])
    assert two == one
