"""Rank 0: what a tool call cut off by max_tokens already says, read from its text in the model's own format.

The whole-call parsers fail on a cut call; the client should still learn which function was being called
and the arguments written so far. A call whose name is not complete yet says nothing. Each format reads its
own cut calls (engine/toolformats/base.py ToolFormat.partial).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from engine.toolformats.base import ToolFormat
from ipc.messages import ToolCall


def cut_call(fmt: ToolFormat | None, text: str, tools: list[dict[str, Any]] | None = None) -> ToolCall | None:
    """The call text (after its start marker) was cut by max_tokens: its name and arguments so far, marked
    partial; None when the format reads no name from it. tools: the declared ones."""
    name, arguments = fmt.partial(text, tools) if fmt is not None else (None, "")
    if not name:
        return None
    return ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", name=name, arguments=arguments, partial=True)


def with_cut_call(calls: list[ToolCall] | None, cut: ToolCall | None) -> list[ToolCall] | None:
    """The calls of a text cut by max_tokens: those its parser read, and the cut one its format read. A lenient
    parser (GLM's, MiniCPM 5's, Muse Spark's) reads the cut call as a whole one without the argument being
    written: the cut call replaces it. A call the parser read whole (Mistral's, which has no end marker)
    stays whole."""
    if cut is None or not calls:
        return calls or ([cut] if cut is not None else None)
    last = calls[-1]
    if last.name == cut.name:
        if _same_json(last.arguments, cut.arguments):
            return calls
        if cut.arguments.startswith(last.arguments.removesuffix("}")):
            return [*calls[:-1], cut]
    return [*calls, cut]


def _same_json(a: str, b: str) -> bool:
    try:
        return json.loads(a) == json.loads(b)
    except ValueError:
        return False
