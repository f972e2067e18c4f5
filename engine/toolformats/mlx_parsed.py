"""A format parsed by one of mlx-lm's tool parsers (mlx_lm/tool_parsers/<name>.py): its markers and parser."""

from __future__ import annotations

import importlib
from typing import Any

from engine.toolformats.base import ToolFormat
from engine.toolformats.tools import decode_arguments


class MlxParsed(ToolFormat):
    """Markers and parsing from mlx-lm's module of the same name; subclasses add the grammar.

    Arguments come back decoded by the tool's schema (engine/toolformats/tools.py decode_arguments), so a
    value the grammar wrote as JSON is its JSON value whatever mlx-lm's parser made of it.
    """

    def __init__(self, name: str):
        self.name = name
        self._module = importlib.import_module(f"mlx_lm.tool_parsers.{name}")
        self.start = self._module.tool_call_start
        self.end = self._module.tool_call_end or ""

    def parse(self, text: str, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        parsed = self._module.parse_tool_call(text, tools)
        calls = parsed if isinstance(parsed, list) else [parsed]
        for call in calls:
            if isinstance(call.get("arguments"), dict):
                call["arguments"] = decode_arguments(call["arguments"], call.get("name"), tools)
        return calls
