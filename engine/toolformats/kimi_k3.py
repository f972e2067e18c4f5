"""Kimi K3's format (XTML): a tools section of calls, each carrying its arguments as one JSON object block,

    <|open|>tools<|sep|><|open|>call tool="NAME" index="1"<|sep|><|open|>json type="object"<|sep|>{...}<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|>

(<|open|>, <|close|> and <|sep|> are special tokens). The model may also write each argument apart, typed
(`<|open|>argument key="K" type="string"<|sep|>`); both parse, the grammar writes the JSON block."""

from __future__ import annotations

import json
import re
from typing import Any

from engine.toolformats.cut import json_so_far
from engine.toolformats.mlx_parsed import MlxParsed
from engine.toolformats.tools import allowed


CALL, BLOCK, CLOSE = "<|open|>call", '<|open|>json type="object"<|sep|>', "<|close|>"
_NAME = re.compile(r'[^<]*?\btool="([^"]+)"')


class KimiK3(MlxParsed):
    def grammar(self, parts: Any, tools: list[dict[str, Any]], named: str | None, parallel: bool) -> str:
        opening, sep = parts.literal("<|open|>"), parts.literal("<|sep|>")
        several = parallel and named is None
        index = '/[1-9][0-9]{0,2}/' if several else '"1"'
        block = f'{opening} {json.dumps("json type=" + chr(34) + "object" + chr(34))} {sep}'
        bodies = []
        for tool in allowed(tools, named):
            head = json.dumps(f'call tool="{tool.name}" index="')
            bodies.append(f"{head} {index} {json.dumps(chr(34))} {sep} {block} {parts.json(tool.schema, tool.blame)} "
                          f'{parts.literal("<|close|>json<|sep|>")}')
        call = parts.rule(f'{opening} ({" | ".join(bodies)}) {parts.literal("<|close|>call<|sep|>")}')
        return f'calls: {parts.literal(self.start)} {call}{"+" if several else ""} {parts.literal(self.end)}'

    def partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> tuple[str | None, str]:
        """The last call's name once its attribute is closed, and the JSON block's text so far (a call that
        writes its arguments apart, typed, gives its name alone)."""
        _, found, last = text.rpartition(CALL)
        name = _NAME.match(last) if found and "<|close|>call" not in last else None
        if name is None:
            return None, ""
        _, opened, arguments = last.partition(BLOCK)
        return name.group(1), json_so_far(arguments, CLOSE) if opened else ""


FORMAT = KimiK3("kimi_k3")
