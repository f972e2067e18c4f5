"""Mistral's format (tokenizer v11 and later: Mistral Small 3.2, Devstral, Ministral 3): each call
`[TOOL_CALLS]NAME[ARGS]{JSON}`, with no end marker: the calls run to the end of the output."""

from __future__ import annotations

import json
import re
from typing import Any

from engine.toolformats.cut import json_so_far
from engine.toolformats.mlx_parsed import MlxParsed
from engine.toolformats.tools import allowed


# the name is whole once the `[ARGS]` marker starts after it
_NAME = re.compile(r"\s*([\w.\-]+)\s*\[")


class Mistral(MlxParsed):
    def grammar(self, parts: Any, tools: list[dict[str, Any]], named: str | None, parallel: bool) -> str:
        args = parts.literal("[ARGS]")
        bodies = [f"{json.dumps(tool.name)} {args} {parts.json(tool.schema, tool.blame)}"
                  for tool in allowed(tools, named)]
        call = parts.rule(f'{parts.literal(self.start)} ({" | ".join(bodies)})')
        return f"calls: {call}+" if parallel and named is None else f"calls: {call}"

    def partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> tuple[str | None, str]:
        """The last call (each starts with the marker again), its JSON arguments as written so far."""
        last = text.rpartition(self.start)[2]
        name = _NAME.match(last)
        if name is None:
            return None, ""
        _, opened, arguments = last.partition("[ARGS]")
        return name.group(1), json_so_far(arguments, self.start) if opened else ""


FORMAT = Mistral("mistral")
