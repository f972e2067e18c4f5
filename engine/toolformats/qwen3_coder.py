"""Qwen3-Coder's format: `<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>`,
a string VALUE as raw text (its template renders strings with `| string`), any other as JSON."""

from __future__ import annotations

import json
from typing import Any

from engine.toolformats import xml
from engine.toolformats.mlx_parsed import MlxParsed
from engine.toolformats.tools import allowed


# Each value opens with a newline, which the parser drops with the one before its closing tag.
MARKUP = xml.Markup(call="<function=", name=r"\s*([^\s<>]+)>", key="<parameter=", key_end=">", value="\n",
                    value_end="\n</parameter>", call_end="</function>")


class Qwen3Coder(MlxParsed):
    def grammar(self, parts: Any, tools: list[dict[str, Any]], named: str | None, parallel: bool) -> str:
        bodies = []
        for tool in allowed(tools, named):
            args = xml.arguments(parts, tool, lambda key: json.dumps(f"<parameter={key}>\n"), "\n</parameter>\n",
                                 forbid=(self.end, "</function>"))
            bodies.append(f'{json.dumps(f"<function={tool.name}>")} "\\n" {args} "</function>\\n"')
        call = parts.rule(f'{parts.literal(self.start)} "\\n" ({" | ".join(bodies)}) {parts.literal(self.end)}')
        return f'calls: {call} ("\\n" {call})*' if parallel and named is None else f"calls: {call}"

    def partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> tuple[str | None, str]:
        return xml.partial(MARKUP, text, tools)


FORMAT = Qwen3Coder("qwen3_coder")
