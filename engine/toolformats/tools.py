"""What every format's grammar and parser read from the declared tools: each allowed tool's argument schema,
its parameters one by one (for formats that write each argument apart), and which of them are raw text.

One rule decides how an XML-style format writes a parameter, in the grammar and in the parser alike: a
parameter whose schema says `"type": "string"` is written as raw text (as the families' templates render
strings), every other one as JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engine.decoding.grammar_error import GrammarError

# A function declared without parameters takes none, as OpenAI reads it: its arguments are {}.
NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class Tool:
    """One tool a forced call may use: its name, its arguments' schema, and how an error names it."""

    name: str
    schema: dict[str, Any]
    param: str  # the request field of its schema: tools[i].function.parameters

    @property
    def blame(self) -> tuple[str, str]:
        return f"{self.param} (function {self.name!r})", self.param


def allowed(tools: list[dict[str, Any]], named: str | None) -> list[Tool]:
    """The tools a forced call may use (only `named` when given); raises GrammarError."""
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function", {})
        name = fn.get("name")
        if named is not None and name != named:
            continue
        param = f"tools[{i}].function.parameters"
        params = fn.get("parameters")
        if params is None:
            params = NO_ARGUMENTS
        elif not isinstance(params, dict):
            raise GrammarError(f"{param} (function {name!r}) must be a JSON schema object", param)
        elif not params:
            params = {"type": "object"}
        out.append(Tool(str(name), params, param))
    if not out:
        raise GrammarError(f"tool_choice names a function that is not in tools: {named!r}")
    return out


def parameters(tool: Tool) -> list[tuple[str, dict[str, Any], bool]]:
    """(name, schema, required) of each parameter, in the schema's order; each schema carries the root's
    definitions so that its "#/$defs/..." references still resolve on its own."""
    props = tool.schema.get("properties")
    props = props if isinstance(props, dict) else {}
    required = [r for r in tool.schema.get("required", ()) if isinstance(r, str)]
    defs = {k: tool.schema[k] for k in ("$defs", "definitions") if k in tool.schema}
    out = []
    for name in [*props, *(r for r in required if r not in props)]:
        schema = props.get(name, {})
        schema = schema if isinstance(schema, dict) else {}  # `true`: any value
        out.append((name, {**schema, **defs} if defs and "$ref" in json.dumps(schema) else schema,
                    name in required))
    return out


def raw_string(schema: dict[str, Any]) -> bool:
    """Whether an XML-style format writes this parameter as raw text rather than JSON."""
    return schema.get("type") == "string"


def decode_arguments(arguments: dict[str, Any], name: Any, tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Arguments as their schema reads them: text a parser left undecoded for a parameter that is not raw
    text becomes the JSON value it spells (mlx-lm's XML parsers keep e.g. an anyOf's JSON as text)."""
    props = declared_properties(name, tools)
    out = {}
    for key, value in arguments.items():
        schema = props.get(key)
        if isinstance(value, str) and isinstance(schema, dict) and not raw_string(schema):
            try:
                value = json.loads(value)
            except ValueError:
                pass  # the model's own words: kept as written
        out[key] = value
    return out


def declared_properties(name: Any, tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The properties of the declared tool of that name ({} when there is none)."""
    for tool in tools or ():
        fn = tool.get("function") or {}
        if fn.get("name") == name:
            props = (fn.get("parameters") or {}).get("properties")
            return props if isinstance(props, dict) else {}
    return {}
