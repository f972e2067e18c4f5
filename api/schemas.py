"""JSON schemas of constrained output as each dialect reads them: objects that do not say whether they allow
undeclared keys.

JSON Schema lets an object without `additionalProperties` hold any other key, and llguidance enforces that
literally: a model with random weights then invents keys. Ollama's conversion (llama.cpp's
json-schema-to-grammar) and OpenAI's and Anthropic's structured outputs read the schema as closed instead, so a
dialect that reads it so closes it here before the engine writes its grammar.
"""

from __future__ import annotations

from typing import Any

# keywords whose value is a schema or a list of schemas, and those whose value maps names to schemas (data
# keywords such as enum, const and default are never walked)
_SUBSCHEMAS = ("additionalProperties", "items", "prefixItems", "anyOf", "oneOf", "allOf", "not", "if", "then", "else",
               "contains", "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def closed(schema: Any) -> Any:
    """schema with `additionalProperties: false` on every object schema that declares properties and does not
    say (a copy; schema is left as it is). An object without properties stays any object, as Ollama's "json"
    and OpenAI's json_object are; an explicit `additionalProperties` is kept."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), (dict, list)):
            out[key] = closed(out[key])
    for key in _MAP:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed(s) for name, s in out[key].items()}
    if _declares_an_object(out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _declares_an_object(schema: dict[str, Any]) -> bool:
    """An object schema with properties (untyped too, as llama.cpp reads it), or a type list naming object."""
    if not isinstance(schema.get("properties"), dict):
        return False
    kind = schema.get("type")
    return kind is None or kind == "object" or (isinstance(kind, list) and "object" in kind)
