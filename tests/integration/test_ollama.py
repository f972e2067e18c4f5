"""The official ollama client against the real engine and API on the demo model.

The demo model has random weights: its text is gibberish, and valid JSON comes from constrained
decoding (Ollama has no tool_choice, so no tool call can be forced here).
"""

from __future__ import annotations

import base64
import json

import httpx
import jsonschema
import ollama
import pytest

MESSAGES = [{"role": "user", "content": "hello"}]
GREEDY = {"temperature": 0, "num_predict": 24}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0,
                                                                          "maximum": 120}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
# in the key order the ollama client sends (it rebuilds tools, "required" before "properties"): chat templates
# print tools as JSON, so the same order is the same prompt through /v1 too
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Forecast", "parameters": {
    "type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def llama(stack):
    with ollama.Client(host=stack.base_url, timeout=60) as c:
        yield c


def test_list_show_ps_and_version(llama, stack):
    (listed,) = llama.list().models
    assert listed.model == "demo-tiny" and listed.size > 0 and listed.details.family == "qwen3"
    show = llama.show("demo-tiny:latest")
    assert {"completion", "tools"} <= set(show.capabilities)
    assert show.modelinfo["general.architecture"] == "qwen3"
    context = stack.probe()["context_length"]
    assert show.modelinfo["qwen3.context_length"] == context
    assert show.details.parameter_size and show.template
    (running,) = llama.ps().models
    assert running.model == "demo-tiny" and running.context_length == context and running.size_vram > 0
    r = httpx.get(stack.base_url + "/api/version", timeout=10)
    assert tuple(int(p) for p in r.json()["version"].split(".")) >= (0, 6, 4)
    assert httpx.get(stack.base_url + "/", timeout=10).text == "Ollama is running"


def test_chat_plain_and_streamed_agree(llama):
    full = llama.chat(model="default", messages=MESSAGES, options=GREEDY)
    assert full.done and full.done_reason in ("stop", "length")
    assert full.prompt_eval_count > 0 and 0 < full.eval_count <= 24 and full.eval_duration > 0
    parts = list(llama.chat(model="default", messages=MESSAGES, options=GREEDY, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content or "" for p in parts) == full.message.content
    assert "".join(p.message.thinking or "" for p in parts) == (full.message.thinking or "")
    assert parts[-1].eval_count == full.eval_count and parts[-1].done_reason == full.done_reason


def test_generate_plain_and_streamed_agree(llama):
    full = llama.generate(model="default", prompt="Once upon a time", options=GREEDY)
    assert full.done and full.eval_count > 0
    parts = list(llama.generate(model="default", prompt="Once upon a time", options=GREEDY, stream=True))
    assert "".join(p.response for p in parts) == full.response and parts[-1].done
    raw = llama.generate(model="default", prompt="Once upon a time", raw=True, options={"num_predict": 4})
    assert raw.done and raw.prompt_eval_count < full.prompt_eval_count  # no chat template around it


def test_format_schema_gives_json_that_validates(llama):
    for seed in range(3):
        r = llama.chat(model="default", messages=MESSAGES, format=PERSON, think=False,
                       options={"seed": seed, "num_predict": 120})
        assert r.done_reason == "stop"
        jsonschema.validate(json.loads(r.message.content), PERSON)
    r = llama.generate(model="default", prompt="Give me JSON.", format="json", options={"seed": 1, "num_predict": 400})
    assert isinstance(json.loads(r.response), dict)


def test_a_tool_call_round_trip_is_accepted(llama):
    history = [*MESSAGES,
               {"role": "assistant", "content": "", "tool_calls": [
                   {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "content": "sunny", "tool_name": "get_weather"}]
    r = llama.chat(model="default", messages=history, tools=[WEATHER], options={"num_predict": 8})
    assert r.done and r.eval_count > 0
    shorter = llama.chat(model="default", messages=history[:1], tools=[WEATHER], options={"num_predict": 1})
    assert r.prompt_eval_count > shorter.prompt_eval_count  # the call and its result reached the prompt


def test_errors_in_ollama_shape(llama):
    with pytest.raises(ollama.ResponseError) as err:
        llama.chat(model="llama3.2", messages=MESSAGES)
    assert err.value.status_code == 404 and "model 'llama3.2' not found" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        llama.pull("llama3.2")
    assert err.value.status_code == 501 and "not supported" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        llama.chat(model="default", messages=[{"role": "user", "content": "what is this?",
                                               "images": [base64.b64encode(b"\x89PNG").decode()]}])
    assert err.value.status_code == 400 and "images" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        llama.embed(model="default", input="hello")
    # no EMBEDDING_MODEL here: the answer names the setting that would serve it
    assert err.value.status_code == 404 and "EMBEDDING_MODEL" in err.value.error


def test_greedy_output_equals_chat_completions(llama, client):
    system, user = "You are terse.", "Name a colour."
    chat = client.chat.completions.create(model="default", max_tokens=24, temperature=0, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": user}])
    r = llama.chat(model="default", options=GREEDY, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": user}])
    assert r.prompt_eval_count == chat.usage.prompt_tokens
    assert r.eval_count == chat.usage.completion_tokens
    assert r.message.content == chat.choices[0].message.content
    assert (r.message.thinking or None) == chat.choices[0].message.model_extra.get("reasoning_content")


def test_greedy_output_with_tool_turns_equals_chat_completions(llama, client):
    chat = client.chat.completions.create(model="default", max_tokens=24, temperature=0, tools=[WEATHER], messages=[
        *MESSAGES,
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "cold"},
    ])
    r = llama.chat(model="default", options=GREEDY, tools=[WEATHER], messages=[
        *MESSAGES,
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "cold", "tool_name": "get_weather"},
    ])
    assert r.prompt_eval_count == chat.usage.prompt_tokens
    assert r.eval_count == chat.usage.completion_tokens
    assert r.message.content == (chat.choices[0].message.content or "")


def test_a_format_schema_that_does_not_say_additional_properties_allows_no_other_key(llama):
    # as Ollama's own conversion reads it: declared properties only (random weights invent keys otherwise)
    weather = {"type": "object", "properties": {"location": {"type": "string", "maxLength": 10},
                                                "unit": {"enum": ["celsius", "fahrenheit"]},
                                                "days": {"type": "array", "items": {"type": "integer", "minimum": 0,
                                                                                    "maximum": 9}, "maxItems": 3}}}
    for seed in range(8):
        r = llama.chat(model="default", messages=MESSAGES, format=weather, think=False,
                       options={"seed": seed, "num_predict": 200})
        assert r.done_reason == "stop", (seed, r.message.content)
        doc = json.loads(r.message.content)
        assert set(doc) <= {"location", "unit", "days"}, (seed, doc)
        jsonschema.validate(doc, weather)
