"""The pythonic format (LFM2, LFM2.5): a Python list of calls with keyword arguments,
`<|tool_call_start|>[get_weather(city="Rome", days=3)]<|tool_call_end|>`. Values are written as JSON, which
mlx-lm's parser reads as Python literals with JSON's true, false and null (as the templates render them)."""

from __future__ import annotations

import json
import re
from typing import Any

from engine.decoding.grammar_error import GrammarError
from engine.toolformats.listed import cut_items, separated, top_level
from engine.toolformats.mlx_parsed import MlxParsed
from engine.toolformats.tools import allowed, parameters


_CALL = re.compile(r"\s*([\w.]+)\(")


class Pythonic(MlxParsed):
    def grammar(self, parts: Any, tools: list[dict[str, Any]], named: str | None, parallel: bool) -> str:
        bodies = []
        for tool in allowed(tools, named):
            if not tool.name.isidentifier():
                raise GrammarError(f"function {tool.name!r} cannot be called in this model's pythonic tool-call "
                                   "format: its name is not a Python identifier",
                                   tool.param.removesuffix(".parameters") + ".name")
            items = [(f"{json.dumps(key + '=')} {parts.json(schema, tool.blame)}", required)
                     for key, schema, required in parameters(tool)]
            bodies.append(f'{json.dumps(tool.name + "(")} {separated(parts, items, ", ")} ")"')
        call = parts.rule(" | ".join(bodies))
        several = f'("," " " {call})*' if parallel and named is None else ""
        return f'calls: {parts.literal(self.start)} "[" {call} {several} "]" {parts.literal(self.end)}'

    def partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> tuple[str | None, str]:
        """The list's last call: its name once its parenthesis opens, its keyword arguments so far as JSON."""
        _, found, listed = text.partition("[")
        calls, closed = top_level(listed, "") if found else ([], True)
        head = None if closed else _CALL.match(calls[-1])
        if head is None:
            return None, ""
        arguments, whole = cut_items(calls[-1][head.end():], "=")
        return head.group(1), arguments + ("}" if whole else "")


FORMAT = Pythonic("pythonic")
