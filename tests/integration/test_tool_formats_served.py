"""Forced tool calls in every mlx-lm format, served on one rank: each format's zoo model (its family's template
and markers) answers a required and a named tool_choice with calls whose arguments validate against the schema,
streamed exactly as not streamed, through chat completions. What only serving adds per format is the engine's
side (the model's template, the grammar on real tokens, the detokeniser feeding the splitter), so one dialect
shows it; the dialects never see a format, only calls (and a forced call reaches them whole, in the closing
piece, in every format), so Anthropic's messages, Responses and Ollama's chat (no tool_choice: its `format`
beside tools makes the answer either that JSON or a call) are served on one format, Qwen3-Coder's XML.
The families' own chat formats (gpt-oss harmony, DeepSeek's) are served in tests/integration/test_toolformats_forced.py.

The models have random weights: every valid call below is the grammar's doing. Greedy decoding, so a streamed
request must equal its non-streamed twin."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import ollama
import openai
import pytest

from engine.zoo.names import TOOL_MODELS
from tests.harness import Stack, assert_engine_logs_clean

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "note": {"type": "string", "maxLength": 6},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
TOOLS = [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in SCHEMAS.items()]
MESSAGES = [{"role": "user", "content": "What is the weather in Rome?"}]
# room for the longest envelope: a DSML call (DeepSeek V3.2) spells its markers in ~165 tokens of the zoo's vocabulary
LIMIT = 320
ANSWER = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}


def _valid(calls: list[tuple[str, dict]], named: str | None = None, schemas=SCHEMAS) -> list[tuple[str, dict]]:
    assert calls
    for name, arguments in calls:
        assert named in (None, name)
        jsonschema.validate(arguments, schemas[name])
    return calls


def _as_ollama_sends(schema: dict) -> dict:
    """A tool schema as the ollama client sends it: its Tool model keeps each property's type, items, description
    and enum, and drops every other keyword (minimum, maximum, maxLength), so the server never sees them."""
    props = {k: {f: v for f, v in p.items() if f in ("type", "items", "description", "enum")}
             for k, p in schema["properties"].items()}
    return {**schema, "properties": props}


def _chat(client: openai.OpenAI, choice) -> list[tuple[str, dict]]:
    kw = {"model": "default", "messages": MESSAGES, "tools": TOOLS, "tool_choice": choice, "temperature": 0,
          "max_tokens": LIMIT, "parallel_tool_calls": False}
    r = client.chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "tool_calls" and not r.choices[0].message.content
    whole = [(c.function.name, json.loads(c.function.arguments)) for c in r.choices[0].message.tool_calls]
    parts: dict[int, list[str]] = {}
    content = ""
    for chunk in client.chat.completions.create(**kw, stream=True):
        for choice_delta in chunk.choices:
            content += choice_delta.delta.content or ""
            for d in choice_delta.delta.tool_calls or ():
                entry = parts.setdefault(d.index, ["", ""])
                entry[0] += d.function.name or ""
                entry[1] += d.function.arguments or ""
    assert content == ""
    assert [(n, json.loads(a)) for n, a in parts.values()] == whole
    return whole


def _messages(claude: anthropic.Anthropic, choice: dict) -> list[tuple[str, dict]]:
    kw = {"model": "default", "max_tokens": LIMIT, "messages": MESSAGES, "tool_choice": choice,
          "tools": [{"name": n, "input_schema": s} for n, s in SCHEMAS.items()], "extra_body": {"temperature": 0}}
    m = claude.messages.create(**kw)
    assert m.stop_reason == "tool_use"
    whole = [(b.name, b.input) for b in m.content if b.type == "tool_use"]
    with claude.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == whole
    assert not [b for b in final.content if b.type == "text" and b.text]
    return whole


def _responses(client: openai.OpenAI, choice) -> list[tuple[str, dict]]:
    kw = {"model": "default", "input": MESSAGES[0]["content"], "max_output_tokens": LIMIT, "temperature": 0,
          "tool_choice": choice, "parallel_tool_calls": False,
          "tools": [{"type": "function", "name": n, "parameters": s} for n, s in SCHEMAS.items()]}
    r = client.responses.create(**kw)
    whole = [(o.name, json.loads(o.arguments)) for o in r.output if o.type == "function_call"]
    with client.responses.stream(**kw) as stream:
        final = stream.get_final_response()
    assert [(o.name, json.loads(o.arguments)) for o in final.output if o.type == "function_call"] == whole
    assert not [o for o in final.output if o.type == "message"]
    return whole


def _ollama(local: ollama.Client) -> None:
    kw = {"model": "default", "messages": MESSAGES, "tools": TOOLS, "format": ANSWER,
          "options": {"temperature": 0, "num_predict": LIMIT}}
    whole = local.chat(**kw).message
    content, calls = "", []
    for part in local.chat(**kw, stream=True):
        content += part.message.content or ""
        calls += part.message.tool_calls or []
    assert content == (whole.content or "")
    got = [(c.function.name, dict(c.function.arguments)) for c in calls]
    assert got == [(c.function.name, dict(c.function.arguments)) for c in whole.tool_calls or ()]
    if got:
        _valid(got, schemas={name: _as_ollama_sends(schema) for name, schema in SCHEMAS.items()})
    else:
        jsonschema.validate(json.loads(content), ANSWER)


# the format every dialect is served in: XML parameters, whose raw-text values the format types by the schema
DIALECTS_MODEL = "tools-qwen3_coder"


@pytest.fixture(scope="module")
def stack():
    """One API for the module; each format's engine starts under it, as `./launch.sh switch` does."""
    s = Stack()
    api = s.start_api()
    yield s
    api.stop()


def _every_other_dialect(client: openai.OpenAI, base_url: str) -> None:
    _valid(_responses(client, "required"))
    with anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0, timeout=120) as claude:
        _valid(_messages(claude, {"type": "any", "disable_parallel_tool_use": True}))
        _valid(_messages(claude, {"type": "tool", "name": "get_weather"}), "get_weather")
    with ollama.Client(host=base_url, timeout=120) as local:
        _ollama(local)


@pytest.mark.parametrize("model", TOOL_MODELS)
def test_forced_calls_in_the_models_own_format_served(stack: Stack, model: str) -> None:
    engine = stack.start_engine(MODEL=f"zoo-{model}")
    try:
        with openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0, timeout=120) as client:
            _valid(_chat(client, "required"))
            _valid(_chat(client, {"type": "function", "function": {"name": "get_time"}}), "get_time")
            if model == DIALECTS_MODEL:
                _every_other_dialect(client, stack.base_url)
    finally:
        engine.stop()
    assert_engine_logs_clean(stack)
