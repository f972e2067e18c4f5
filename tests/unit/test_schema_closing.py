"""Schemas that do not say additionalProperties, as each dialect reads them (api/schemas.py)."""

from __future__ import annotations

import copy

import pytest

from api.schemas import closed

pytestmark = pytest.mark.anyio

CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "Hi"}]}
OPEN = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "array", "items": {"type": "object", "properties": {"t": {"type": "number"}}}},
        "where": {"anyOf": [{"$ref": "#/$defs/point"}, {"type": "null"}]},
        "extra": {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "integer"}},
        "free": {"type": "object"},
        "tags": {"type": ["object", "null"], "properties": {"k": {"const": {"properties": {}}}}},
    },
    "$defs": {"point": {"properties": {"x": {"type": "number"}}}},
}


def test_every_object_that_declares_properties_and_does_not_say_is_closed():
    before = copy.deepcopy(OPEN)
    out = closed(OPEN)
    assert OPEN == before  # the client's schema is not changed in place
    props = out["properties"]
    assert out["additionalProperties"] is False
    assert props["days"]["items"]["additionalProperties"] is False
    assert out["$defs"]["point"]["additionalProperties"] is False  # untyped, as llama.cpp reads it
    assert props["tags"]["additionalProperties"] is False
    # what says stays as it says; an object without properties stays any object; data is never walked
    assert props["extra"]["additionalProperties"] == {"type": "integer"}
    assert "additionalProperties" not in props["free"]
    assert props["tags"]["properties"]["k"] == {"const": {"properties": {}}}
    assert closed({"type": "object"}) == {"type": "object"} and closed(True) is True


@pytest.mark.parametrize(("path", "body", "field"), [
    # Ollama reads every format schema as closed
    ("/api/chat", {"format": OPEN, "stream": False}, None),
    # OpenAI and Responses: strict mode reads it closed, a schema without strict means what JSON Schema says
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": OPEN, "strict": True}}}, None),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": OPEN}}}, "open"),
    ("/v1/responses", {"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": OPEN,
                                                          "strict": True}}}, None),
    ("/v1/responses", {"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": OPEN}}},
     "open"),
])
async def test_the_engine_gets_the_schema_as_the_dialect_reads_it(engine, client, path, body, field):
    base = {"model": "test-model"} if path == "/v1/responses" else CHAT
    r = await client.post(path, json={**base, **body})
    assert r.status_code == 200, r.text
    schema = engine.generates[0].json_schema
    assert schema == (OPEN if field == "open" else closed(OPEN))
