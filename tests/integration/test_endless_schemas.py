"""Schemas no finite value satisfies, and schemas too large to enforce, in every dialect: refused with a
400 naming the parameter before anything is generated; a schema that can be enforced is served whole."""

from __future__ import annotations

import json

import httpx
import pytest

MESSAGES = [{"role": "user", "content": "hello there"}]
# An object that must hold another of itself, and an array that must hold at least one of itself.
SELF_NESTED = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}
NONEMPTY_NEST = {"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 1}},
                 "$ref": "#/$defs/n"}
ENDLESS = {"self-nested object": SELF_NESTED, "non-empty nested array": NONEMPTY_NEST}


def request(dialect: str, schema: dict) -> tuple[str, dict]:
    """(path, body) of a request whose output is held to schema, as each dialect's clients send it."""
    if dialect == "chat response_format":
        return "/v1/chat/completions", {"model": "default", "messages": MESSAGES, "max_tokens": 16, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    if dialect == "chat forced tool":
        return "/v1/chat/completions", {"model": "default", "messages": MESSAGES, "max_tokens": 16, "tools": [
            {"type": "function", "function": {"name": "f", "parameters": schema}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}}}
    if dialect == "responses text.format":
        return "/v1/responses", {"model": "default", "input": "hello there", "max_output_tokens": 16, "text": {
            "format": {"type": "json_schema", "name": "x", "schema": schema}}}
    if dialect == "anthropic forced tool":
        return "/v1/messages", {"model": "default", "max_tokens": 16, "messages": MESSAGES,
                                "tools": [{"name": "f", "input_schema": schema}],
                                "tool_choice": {"type": "tool", "name": "f"}}
    assert dialect == "ollama format"
    return "/api/chat", {"model": "default", "messages": MESSAGES, "format": schema, "options": {"num_predict": 16}}


DIALECTS = ["chat response_format", "chat forced tool", "responses text.format", "anthropic forced tool",
            "ollama format"]


def post(stack, path: str, body: dict) -> httpx.Response:
    with httpx.Client(timeout=120) as http:
        return http.post(stack.base_url + path, json=body)


# The parameter at fault, as the dialect calls it or as the engine does (OpenAI chat's names).
NAMES = {
    "chat response_format": ("response_format",),
    "chat forced tool": ("tools[0].function.parameters",),
    "responses text.format": ("text.format", "response_format"),
    "anthropic forced tool": ("tools[0].input_schema", "tools[0].function.parameters"),
    "ollama format": ("format", "response_format"),
}


def tracebacks(stack) -> int:
    return stack.procs["engine"].log.read_text(errors="replace").count("Traceback")


def error_message(dialect: str, r: httpx.Response) -> str:
    """The message of the dialect's own invalid-request error."""
    body = r.json()
    if dialect.startswith("ollama"):
        return body["error"]
    if dialect.startswith("anthropic"):
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
        return body["error"]["message"]
    assert body["error"]["type"] == "invalid_request_error", body
    assert body["error"]["param"] in NAMES[dialect], body
    return body["error"]["message"]


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("schema", ENDLESS.values(), ids=ENDLESS.keys())
def test_a_schema_no_finite_value_satisfies_is_a_400_naming_it_in_every_dialect(stack, dialect, schema):
    before = tracebacks(stack)
    r = post(stack, *request(dialect, schema))
    assert r.status_code == 400, r.text
    message = error_message(dialect, r)
    assert "no finite value" in message and "optional" in message, message
    assert any(name in message for name in NAMES[dialect]), message
    # refused at admission: nothing ran, so nothing failed in the engine
    assert tracebacks(stack) == before


def chat_json(stack, schema: dict, **more) -> dict:
    path, body = request("chat response_format", schema)
    r = post(stack, path, {**body, "max_tokens": 96, "temperature": 1.0, "seed": 3, **more})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_a_schema_whose_recursion_can_end_is_served(stack):
    linked = {"type": "object", "properties": {"value": {"type": "integer"}, "next": {"$ref": "#"}},
              "required": ["value"], "additionalProperties": False}
    choice = chat_json(stack, linked)
    if choice["finish_reason"] == "stop":
        node = json.loads(choice["message"]["content"])
        while node is not None:
            assert set(node) <= {"value", "next"} and isinstance(node["value"], int), node
            node = node.get("next")


def test_an_object_of_hundreds_of_optional_properties_is_served(stack):
    # Its first key's parser row holds ~4 items a property: llguidance's mask allowed a key that
    # consuming it then refused (a row limit of 2,000 items against 50,000 for the mask).
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(600)},
            "additionalProperties": False}
    choice = chat_json(stack, wide, seed=0)
    if choice["finish_reason"] == "stop":
        assert set(json.loads(choice["message"]["content"])) <= set(wide["properties"])
