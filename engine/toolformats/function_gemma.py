"""FunctionGemma's format: `<start_function_call>call:NAME{key:<escape>text<escape>,key:3}<end_function_call>`.

mlx-lm's parser ends the arguments at the first `}` and a non-string value at the first `,`: so string values
are raw text without `}`, and only values whose JSON holds neither (numbers, booleans, null, enums of such)
can be enforced; a parameter of another kind is refused with 400, naming the function."""

from __future__ import annotations

from typing import Any

from engine.decoding.grammar_error import GrammarError
from engine.toolformats.listed import braced_calls, cut_braced
from engine.toolformats.mlx_parsed import MlxParsed
from engine.toolformats.tools import raw_string

ESCAPE = "<escape>"
_SCALARS = ("integer", "number", "boolean", "null")


class FunctionGemma(MlxParsed):
    def grammar(self, parts: Any, tools: list[dict[str, Any]], named: str | None, parallel: bool) -> str:
        def value(tool: Any, key: str, schema: dict[str, Any]) -> str:
            if raw_string(schema):
                return f"{parts.literal(ESCAPE)} {parts.text(ESCAPE, schema, ('}', self.end), blame=tool.blame)}"
            if _flat(schema):
                return parts.json(schema, tool.blame)
            raise GrammarError(
                f"{tool.blame[0]}: parameter {key!r} cannot be enforced in this model's tool-call format "
                "(FunctionGemma's), which holds strings, numbers, booleans and null only", tool.param)

        return braced_calls(self, parts, tools, named, parallel, value)

    def partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> tuple[str | None, str]:
        return cut_braced(text, ESCAPE)


def _flat(schema: dict[str, Any]) -> bool:
    """Whether every JSON value of schema is free of `,` and `}` (a scalar that is not a string)."""
    if schema.get("type") in _SCALARS:
        return True
    choices = schema.get("enum") if "const" not in schema else [schema["const"]]
    return isinstance(choices, list) and bool(choices) and all(
        not isinstance(c, (str, list, dict)) for c in choices)


FORMAT = FunctionGemma("function_gemma")
