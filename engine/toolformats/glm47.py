"""GLM-4.7's format (also GLM-5 and Poolside Laguna): `<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...</tool_call>`,
a string VALUE as raw text, any other as JSON (its template: `v | tojson if v is not string else v`).
mlx-lm's parser strips each value, so the grammar writes none with whitespace at either end."""

from __future__ import annotations

import json
from typing import Any

from engine.toolformats import xml
from engine.toolformats.mlx_parsed import MlxParsed
from engine.toolformats.tools import allowed


class Glm47(MlxParsed):
    def grammar(self, parts: Any, tools: list[dict[str, Any]], named: str | None, parallel: bool) -> str:
        key_open, key_close, value_open = (parts.literal(m) for m in ("<arg_key>", "</arg_key>", "<arg_value>"))
        bodies = []
        for tool in allowed(tools, named):
            args = xml.arguments(parts, tool, lambda key: f"{key_open} {json.dumps(key)} {key_close} {value_open}",
                                 "</arg_value>", forbid=(self.end,), strip=True)
            bodies.append(f"{json.dumps(tool.name)} {args}")
        call = parts.rule(f'{parts.literal(self.start)} ({" | ".join(bodies)}) {parts.literal(self.end)}')
        return f"calls: {call}+" if parallel and named is None else f"calls: {call}"


FORMAT = Glm47("glm47")
