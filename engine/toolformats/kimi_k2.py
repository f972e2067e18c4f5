"""Kimi K2's format: one section of calls, each `<|tool_call_begin|>functions.NAME:INDEX<|tool_call_argument_begin|>{JSON}<|tool_call_end|>`,
between `<|tool_calls_section_begin|>` and `<|tool_calls_section_end|>` (all special tokens)."""

from __future__ import annotations

import json
import re
from typing import Any

from engine.toolformats.cut import json_so_far
from engine.toolformats.mlx_parsed import MlxParsed
from engine.toolformats.tools import allowed


BEGIN, ARGUMENTS, END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
# `functions.NAME:INDEX`: the name is whole at the colon before its index
_NAME = re.compile(r"\s*(?:functions\.)?([^:<]+):")


class KimiK2(MlxParsed):
    def grammar(self, parts: Any, tools: list[dict[str, Any]], named: str | None, parallel: bool) -> str:
        begin, arguments, end = (parts.literal(m) for m in
                                 ("<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"))
        several = parallel and named is None
        # the index counts the calls of a turn; a single call is call 0
        index = '/[0-9]{1,3}/' if several else '"0"'
        bodies = [f'{json.dumps(f"functions.{tool.name}:")} {index} {arguments} {parts.json(tool.schema, tool.blame)}'
                  for tool in allowed(tools, named)]
        call = parts.rule(f'{begin} ({" | ".join(bodies)}) {end}')
        return f'calls: {parts.literal(self.start)} {call}{"+" if several else ""} {parts.literal(self.end)}'

    def partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> tuple[str | None, str]:
        """The last call's name, and its JSON arguments as written so far."""
        _, found, last = text.rpartition(BEGIN)
        name = _NAME.match(last) if found and END not in last else None
        if name is None:
            return None, ""
        _, opened, arguments = last.partition(ARGUMENTS)
        return name.group(1), json_so_far(arguments, END) if opened else ""


FORMAT = KimiK2("kimi_k2")
