"""Muse Spark's format (XML_ATEM): `<atem:function_calls><atem:invoke name="NAME"><atem:parameter name="KEY">VALUE</atem:parameter></atem:invoke></atem:function_calls>`.
mlx-lm's parser reads every VALUE as JSON first (raw text only when that fails, so a raw "42" would become
a number), so the grammar writes every value as JSON, strings included."""

from __future__ import annotations

import json
from typing import Any

from engine.toolformats import xml
from engine.toolformats.mlx_parsed import MlxParsed
from engine.toolformats.tools import allowed, parameters


MARKUP = xml.Markup(call="<atem:invoke name=", name=r'"([^"]+)"[^>]*>', key='<atem:parameter name="',
                    key_end='">', value="", value_end="</atem:parameter>", call_end="</atem:invoke>",
                    json_only=True)


class MuseSpark(MlxParsed):
    def grammar(self, parts: Any, tools: list[dict[str, Any]], named: str | None, parallel: bool) -> str:
        bodies = []
        for tool in allowed(tools, named):
            items = []
            for key, schema, required in parameters(tool):
                opening = json.dumps(f'<atem:parameter name="{key}">')
                item = f'{opening} {parts.json(schema, tool.blame)} "</atem:parameter>"'
                items.append(item if required else f"({item})?")
            opening = json.dumps(f'<atem:invoke name="{tool.name}">')
            bodies.append(f'{opening} {" ".join(items)} "</atem:invoke>"')
        call = parts.rule(f'({" | ".join(bodies)})')
        several = "+" if parallel and named is None else ""
        return f"calls: {parts.literal(self.start)} {call}{several} {parts.literal(self.end)}"

    def partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> tuple[str | None, str]:
        return xml.partial(MARKUP, text, tools)


FORMAT = MuseSpark("muse_spark")
