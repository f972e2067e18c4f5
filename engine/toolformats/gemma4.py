"""Gemma 4's format: `<|tool_call>call:NAME{key:<|"|>text<|"|>,key:3}<tool_call|>`: bare keys, strings between
`<|"|>` markers (raw text), other values JSON (which mlx-lm's parser reads back as JSON)."""

from __future__ import annotations

from typing import Any

from engine.toolformats.listed import braced_calls, cut_braced
from engine.toolformats.mlx_parsed import MlxParsed
from engine.toolformats.tools import raw_string

QUOTE = '<|"|>'


class Gemma4(MlxParsed):
    def grammar(self, parts: Any, tools: list[dict[str, Any]], named: str | None, parallel: bool) -> str:
        def value(tool: Any, key: str, schema: dict[str, Any]) -> str:
            if raw_string(schema):
                return f"{parts.literal(QUOTE)} {parts.text(QUOTE, schema, (self.end,), blame=tool.blame)}"
            return parts.json(schema, tool.blame)

        return braced_calls(self, parts, tools, named, parallel, value)

    def partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> tuple[str | None, str]:
        return cut_braced(text, QUOTE)


FORMAT = Gemma4("gemma4")
