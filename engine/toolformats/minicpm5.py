"""MiniCPM 5's format: no wrapper around its calls, each one `<function name="NAME"><param name="KEY">VALUE</param></function>`,
strings as raw text (mlx-lm's parser strips them, so none starts or ends with whitespace), other values JSON.
The call's own opening, `<function name=`, is the marker that starts it."""

from __future__ import annotations

import json
from typing import Any

from engine.toolformats import xml
from engine.toolformats.mlx_parsed import MlxParsed
from engine.toolformats.tools import allowed


# The text of a call starts after its marker `<function name=`, at the name.
MARKUP = xml.Markup(call="", name=r'\s*"?([^\s"<>]+)"?\s*>', key='<param name="', key_end='">', value="",
                    value_end="</param>", call_end="</function>", strip=True)


class MiniCpm5(MlxParsed):
    def grammar(self, parts: Any, tools: list[dict[str, Any]], named: str | None, parallel: bool) -> str:
        bodies = []
        for tool in allowed(tools, named):
            args = xml.arguments(parts, tool, lambda key: json.dumps(f'<param name="{key}">'), "</param>",
                                 forbid=(self.end,), strip=True)
            bodies.append(f"{json.dumps(chr(34) + tool.name + chr(34) + '>')} {args}")
        call = parts.rule(f'{parts.literal(self.start)} ({" | ".join(bodies)}) {parts.literal(self.end)}')
        return f"calls: {call}+" if parallel and named is None else f"calls: {call}"

    def partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> tuple[str | None, str]:
        return xml.partial(MARKUP, text, tools)


FORMAT = MiniCpm5("minicpm5")
