"""The arguments of XML-style formats, where each argument is written apart between markers of its own
(Qwen3-Coder's `<parameter=KEY>`, GLM's `<arg_key>`/`<arg_value>`, ...): one shared writer of their grammar.

Parameters come in the schema's order; required ones are always written, optional ones may be. A string
parameter is raw text that cannot contain its closing tag, every other one JSON (engine/toolformats/tools.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.toolformats.tools import Tool, parameters, raw_string


def arguments(parts: Any, tool: Tool, opening: Callable[[str], str], close: str, *,
              forbid: tuple[str, ...] = (), strip: bool = False) -> str:
    """A lark expression for tool's arguments: opening(name) is the lark text that opens an argument, close
    the text (or marker) that ends its value; forbid and strip as in GrammarParts.text."""
    items = []
    for name, schema, required in parameters(tool):
        if raw_string(schema):
            value = parts.text(close, schema, forbid, strip, tool.blame)
        else:
            value = f"{parts.json(schema, tool.blame)} {parts.literal(close)}"
        item = f"{opening(name)} {value}"
        items.append(item if required else f"({item})?")
    return " ".join(items) if items else '""'
