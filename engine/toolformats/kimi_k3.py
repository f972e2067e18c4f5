"""Kimi K3's format (XTML): a tools section of calls, each carrying its arguments as one JSON object block,

    <|open|>tools<|sep|><|open|>call tool="NAME" index="1"<|sep|><|open|>json type="object"<|sep|>{...}<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|>

(<|open|>, <|close|> and <|sep|> are special tokens). The model may also write each argument apart, typed
(`<|open|>argument key="K" type="string"<|sep|>`); both parse, the grammar writes the JSON block."""

from __future__ import annotations

import json
from typing import Any

from engine.toolformats.mlx_parsed import MlxParsed
from engine.toolformats.tools import allowed


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


FORMAT = KimiK3("kimi_k3")
