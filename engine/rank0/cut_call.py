"""Rank 0: what a tool call cut off by max_tokens already says, read from its text in the model's own format.

The whole-call parsers fail on a cut call; the client should still learn which function was being called
and the arguments written so far. A call whose name is not complete yet says nothing.
Each format adds its reader to READERS under mlx-lm's parser name.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable

from ipc.messages import ToolCall

# (text after the start marker) -> (name, arguments text so far); name None while it is not written whole
Reader = Callable[[str], "tuple[str | None, str]"]

# `{"name": "get_weather", "arguments": {...`: the name's closing quote is the first thing the reader needs
_JSON_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_JSON_ARGUMENTS = re.compile(r'\s*,\s*"(?:arguments|parameters)"\s*:\s*')


def _json_tools(text: str) -> tuple[str | None, str]:
    head = _JSON_NAME.match(text)
    if head is None:
        return None, ""
    try:
        name = json.loads(f'"{head.group(1)}"')
    except json.JSONDecodeError:  # an escape the model wrote wrong: no name to report
        return None, ""
    rest = text[head.end():]
    key = _JSON_ARGUMENTS.match(rest)
    if key is None:  # cut before (or inside) the arguments key: the name alone is known
        return name, ""
    arguments = rest[key.end():]
    try:  # complete arguments followed by a cut envelope: only the value, not the envelope's rest
        _, end = json.JSONDecoder().raw_decode(arguments)
        arguments = arguments[:end]
    except json.JSONDecodeError:
        pass
    return name, arguments


READERS: dict[str, Reader] = {"json_tools": _json_tools}


def cut_call(parser_name: str, text: str) -> ToolCall | None:
    """The call text (after its start marker) was cut by max_tokens: its name and arguments so far, marked
    partial; None when the format has no reader or the name is not complete."""
    reader = READERS.get(parser_name)
    name, arguments = reader(text) if reader is not None else (None, "")
    if not name:
        return None
    return ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", name=name, arguments=arguments, partial=True)
