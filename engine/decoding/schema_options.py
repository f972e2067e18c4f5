"""How a client's JSON schema becomes part of an llguidance grammar: the options and the finiteness check that
both grammar writers share (engine/decoding/constrained.py for response_format, tool_parts.py for tool calls)."""

from __future__ import annotations

from typing import Any

from engine.decoding.finite import endless_ref
from engine.decoding.grammar_error import GrammarError

# Compact separators and no free whitespace: a model cannot pad JSON with endless blanks, and the
# text reads like json.dumps' default.
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# Tool schemas come from clients as they are: unknown keywords are ignored rather than refused.
TOOL_OPTIONS: dict[str, Any] = {**JSON_OPTIONS, "lenient": True}


def must_end(schema: Any, what: str, param: str | None = None) -> None:
    """Raise GrammarError when schema has no finite value (the grammar would run on without end)."""
    ref = endless_ref(schema)
    if ref is not None:
        where = "the schema" if ref == "#" else f"{ref!r}"
        raise GrammarError(f"{what}: no finite value can satisfy it: every value of {where} must contain "
                           "another one, without end; make the recursive property optional (leave it out of "
                           "required, or allow an empty array)", param)
