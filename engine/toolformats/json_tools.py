"""Qwen's and Hermes' format: one JSON object per call, `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.

The arguments are a %json of their own rather than a property of one wrapper schema, so each tool's
schema stays a root and its "#/$defs/..." references resolve in it.
"""

from __future__ import annotations

import json
from typing import Any

from engine.toolformats.mlx_parsed import MlxParsed
from engine.toolformats.tools import allowed


class JsonTools(MlxParsed):
    def grammar(self, parts: Any, tools: list[dict[str, Any]], named: str | None, parallel: bool) -> str:
        bodies = []
        for tool in allowed(tools, named):
            head = json.dumps({"name": tool.name}, ensure_ascii=False)[:-1] + ', "arguments": '
            bodies.append(f'{json.dumps(head)} {parts.json(tool.schema, tool.blame)} "}}"')
        call = parts.rule(f'{parts.literal(self.start)} "\\n" ({" | ".join(bodies)}) "\\n" {parts.literal(self.end)}')
        return f'calls: {call} ("\\n" {call})*' if parallel and named is None else f"calls: {call}"


FORMAT = JsonTools("json_tools")
