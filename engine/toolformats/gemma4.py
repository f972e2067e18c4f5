"""Gemma 4's format: `<|tool_call>call:NAME{key:<|"|>text<|"|>,key:3}<tool_call|>`: bare keys, strings between
`<|"|>` markers (raw text), other values JSON (which mlx-lm's parser reads back as JSON)."""

from __future__ import annotations

import json
from typing import Any

from engine.toolformats.listed import cut_braced, separated
from engine.toolformats.mlx_parsed import MlxParsed
from engine.toolformats.tools import allowed, parameters, raw_string

QUOTE = '<|"|>'


class Gemma4(MlxParsed):
    def grammar(self, parts: Any, tools: list[dict[str, Any]], named: str | None, parallel: bool) -> str:
        bodies = []
        for tool in allowed(tools, named):
            items = []
            for key, schema, required in parameters(tool):
                if raw_string(schema):
                    value = f"{parts.literal(QUOTE)} {parts.text(QUOTE, schema, (self.end,), blame=tool.blame)}"
                else:
                    value = parts.json(schema, tool.blame)
                items.append((f"{json.dumps(key + ':')} {value}", required))
            bodies.append(f'{json.dumps("call:" + tool.name + "{")} {separated(parts, items, ",")} "}}"')
        call = parts.rule(f'{parts.literal(self.start)} ({" | ".join(bodies)}) {parts.literal(self.end)}')
        return f"calls: {call}+" if parallel and named is None else f"calls: {call}"

    def partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> tuple[str | None, str]:
        return cut_braced(text, QUOTE)


FORMAT = Gemma4("gemma4")
