"""The arguments of XML-style formats, where each argument is written apart between markers of its own
(Qwen3-Coder's `<parameter=KEY>`, GLM's `<arg_key>`/`<arg_value>`, ...): one shared writer of their grammar.

Parameters come in the schema's order; required ones are always written, optional ones may be. A string
parameter is raw text that cannot contain its closing tag, every other one JSON (engine/toolformats/tools.py).
The same formats share one reader of a call cut by max_tokens (`partial`), told their markers by a Markup.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.toolformats.cut import held, open_string, pair
from engine.toolformats.tools import Tool, declared_properties, parameters, raw_string


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


@dataclass(frozen=True)
class Markup:
    """How an XML-style format writes one call, as the reader of a cut call finds its pieces."""

    call: str  # opens each call, before its name ("": the text holds one call, from its name on)
    name: str  # a regex whose group 1 is the name, matching only once what follows shows the name whole
    key: str  # opens a parameter, before its key
    key_end: str  # ends the key
    value: str  # opens the value after key_end ("": nothing); whitespace may come first unless it is "\n"
    value_end: str  # ends the value
    call_end: str  # ends the call
    strip: bool = False  # the parser strips values
    json_only: bool = False  # every value is JSON, strings too (Muse Spark)


def partial(markup: Markup, text: str, tools: list[dict[str, Any]] | None) -> tuple[str | None, str]:
    """The last call's name once written whole, and its arguments so far as a prefix of their JSON object:
    the parameters closed so far decoded as parse reads them (tools.py's rule), then the open one's key and
    its value so far (raw text as a JSON string still open, JSON as written)."""
    _, found, last = text.rpartition(markup.call) if markup.call else ("", True, text)
    head = re.match(markup.name, last) if found and markup.call_end not in last else None
    if head is None:
        return None, ""
    name = head.group(1).strip()
    props = declared_properties(name, tools)
    done = []
    for piece in last[head.end():].split(markup.key)[1:]:
        key, keyed, rest = piece.partition(markup.key_end)
        if markup.value:
            rest = rest if markup.value.isspace() else rest.lstrip()
            if not (keyed and rest.startswith(markup.value)):
                break
            rest = rest[len(markup.value):]
        if not keyed:
            break
        key = key.strip()
        # an undeclared key's value is kept as written, as decode_arguments keeps it
        raw = not markup.json_only and raw_string(props.get(key, {"type": "string"}))
        value, closed, _ = rest.partition(markup.value_end)
        if not closed:
            value = held(value, markup.value_end)
            value = value.strip() if markup.strip or not raw else value
            done.append(open_string(key, value) if raw else f"{json.dumps(key, ensure_ascii=False)}: {value}")
            break
        done.append(pair(key, _decoded(value.strip() if markup.strip else value, raw)))
    return name, "{" + ", ".join(done)


def _decoded(value: str, raw: bool) -> Any:
    if raw:
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value.strip()  # the model's own words, as the parsers keep them
