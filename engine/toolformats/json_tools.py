"""Qwen's and Hermes' format: one JSON object per call, `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.

The arguments are a %json of their own rather than a property of one wrapper schema, so each tool's
schema stays a root and its "#/$defs/..." references resolve in it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from engine.toolformats.mlx_parsed import MlxParsed
from engine.toolformats.tools import allowed

# `{"name": "get_weather", "arguments": {...`: the name's closing quote is the first thing the reader needs
_JSON_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_JSON_ARGUMENTS = re.compile(r'\s*,\s*"(?:arguments|parameters)"\s*:\s*')


class JsonTools(MlxParsed):
    def grammar(self, parts: Any, tools: list[dict[str, Any]], named: str | None, parallel: bool) -> str:
        bodies = []
        for tool in allowed(tools, named):
            head = json.dumps({"name": tool.name}, ensure_ascii=False)[:-1] + ', "arguments": '
            bodies.append(f'{json.dumps(head)} {parts.json(tool.schema, tool.blame)} "}}"')
        call = parts.rule(f'{parts.literal(self.start)} "\\n" ({" | ".join(bodies)}) "\\n" {parts.literal(self.end)}')
        return f'calls: {call} ("\\n" {call})*' if parallel and named is None else f"calls: {call}"

    def partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> tuple[str | None, str]:
        """The name once written whole, and the arguments text so far (only the value once it is complete)."""
        head = _JSON_NAME.match(text)
        if head is None:
            return None, ""
        try:
            name = json.loads(f'"{head.group(1)}"')
        except json.JSONDecodeError:  # an escape the model wrote wrong: no name to report
            return None, ""
        rest = text[head.end():]
        key = _JSON_ARGUMENTS.match(rest)
        if key is None:  # cut before (or inside) the arguments key: the name alone is known
            return name, ""
        arguments = rest[key.end():]
        try:  # complete arguments followed by a cut envelope: only the value, not the envelope's rest
            _, end = json.JSONDecoder().raw_decode(arguments)
            arguments = arguments[:end]
        except json.JSONDecodeError:
            pass
        return name, arguments


FORMAT = JsonTools("json_tools")
