"""MiniMax M2's format: a section of invokes, each argument a `<parameter name="KEY">`, strings as raw text,
other values as JSON (its template: `v | tojson if v is not string else v`):

    <minimax:tool_call>
    <invoke name="NAME">
    <parameter name="KEY">VALUE</parameter>
    </invoke>
    </minimax:tool_call>

mlx-lm's parser strips each value, so the grammar writes none with whitespace at either end."""

from __future__ import annotations

import json
from typing import Any

from engine.toolformats import xml
from engine.toolformats.mlx_parsed import MlxParsed
from engine.toolformats.tools import allowed


MARKUP = xml.Markup(call="<invoke name=", name=r'\s*"?([^"<>]+)"?>', key='<parameter name="', key_end='">',
                    value="", value_end="</parameter>", call_end="</invoke>", strip=True)


class MiniMaxM2(MlxParsed):
    def grammar(self, parts: Any, tools: list[dict[str, Any]], named: str | None, parallel: bool) -> str:
        bodies = []
        for tool in allowed(tools, named):
            args = xml.arguments(parts, tool, lambda key: json.dumps(f'<parameter name="{key}">'), "</parameter>\n",
                                 forbid=(self.end, "</invoke>"), strip=True)
            opening = json.dumps(f'<invoke name="{tool.name}">')
            bodies.append(f'{opening} "\\n" {args} "</invoke>\\n"')
        call = parts.rule(f'({" | ".join(bodies)})')
        several = "+" if parallel and named is None else ""
        return f'calls: {parts.literal(self.start)} "\\n" {call}{several} {parts.literal(self.end)}'

    def partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> tuple[str | None, str]:
        return xml.partial(MARKUP, text, tools)


FORMAT = MiniMaxM2("minimax_m2")
