"""GLM-4.7's format (also GLM-5 and Poolside Laguna): `<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...</tool_call>`,
a string VALUE as raw text, any other as JSON (its template: `v | tojson if v is not string else v`).
mlx-lm's parser strips each value, so the grammar writes none with whitespace at either end. LongCat's
format is the same with markers of its own."""

from __future__ import annotations

import json
import re
from typing import Any

from engine.toolformats import xml
from engine.toolformats.mlx_parsed import MlxParsed
from engine.toolformats.tools import allowed


class ArgKeyValue(MlxParsed):
    """NAME, then each argument as its key between one pair of markers and its value between another."""

    def __init__(self, name: str, prefix: str = ""):
        super().__init__(name)
        self.markers = tuple(f"<{end}{prefix}{kind}>" for kind in ("arg_key", "arg_value") for end in ("", "/"))
        key_open, key_close, value_open, value_close = self.markers
        # the name is whole once a marker (or whitespace) follows it
        self.markup = xml.Markup(call="", name=r"\s*([^\s<]+)(?=[\s<])", key=key_open, key_end=key_close,
                                 value=value_open, value_end=value_close, call_end=self.end, strip=True)

    def parse(self, text: str, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        name = text.strip()
        if re.fullmatch(r"[\w.\-]+", name) and self.markers[0] not in text:
            # a call without arguments: LongCat's parser finds no name before a first key (GLM's does)
            return [{"name": name, "arguments": {}}]
        return super().parse(text, tools)

    def grammar(self, parts: Any, tools: list[dict[str, Any]], named: str | None, parallel: bool) -> str:
        key_open, key_close, value_open, value_close = self.markers
        key_open, key_close, value_opening = (parts.literal(m) for m in (key_open, key_close, value_open))
        bodies = []
        for tool in allowed(tools, named):
            args = xml.arguments(parts, tool, lambda key: f"{key_open} {json.dumps(key)} {key_close} {value_opening}",
                                 value_close, forbid=(self.end,), strip=True)
            bodies.append(f"{json.dumps(tool.name)} {args}")
        call = parts.rule(f'{parts.literal(self.start)} ({" | ".join(bodies)}) {parts.literal(self.end)}')
        return f"calls: {call}+" if parallel and named is None else f"calls: {call}"

    def partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> tuple[str | None, str]:
        return xml.partial(self.markup, text, tools)


FORMAT = ArgKeyValue("glm47")
