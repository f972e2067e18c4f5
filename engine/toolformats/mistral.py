"""Mistral's format (tokenizer v11 and later: Mistral Small 3.2, Devstral, Ministral 3): each call
`[TOOL_CALLS]NAME[ARGS]{JSON}`, with no end marker: the calls run to the end of the output."""

from __future__ import annotations

import json
from typing import Any

from engine.toolformats.mlx_parsed import MlxParsed
from engine.toolformats.tools import allowed


class Mistral(MlxParsed):
    def grammar(self, parts: Any, tools: list[dict[str, Any]], named: str | None, parallel: bool) -> str:
        args = parts.literal("[ARGS]")
        bodies = [f"{json.dumps(tool.name)} {args} {parts.json(tool.schema, tool.blame)}"
                  for tool in allowed(tools, named)]
        call = parts.rule(f'{parts.literal(self.start)} ({" | ".join(bodies)})')
        return f"calls: {call}+" if parallel and named is None else f"calls: {call}"


FORMAT = Mistral("mistral")
