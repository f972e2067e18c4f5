"""The object a cut-off JSON text already holds: every value written whole, inside the containers opened so far.

Dialects whose tool-call arguments are an object (Anthropic's input, Ollama's arguments) use it for a call cut
by max_tokens. It reads a cut text as the Anthropic SDK reads a stream cut mid-call (jiter's partial mode), so
a streamed and a non-streamed answer agree: a string not yet closed is left out, a number is kept as far as
written: `{"city": "Par` gives {}, `{"city": "Paris", "days": [1, 2` gives {"city": "Paris", "days": [1, 2]}.
"""

from __future__ import annotations

import json
import re
from typing import Any

# one JSON token: a whole string, a number or literal, or punctuation
_TOKEN = re.compile(r'\s*(?:("(?:[^"\\]|\\.)*")'
                    r'|(-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null)(?=[\s,\]}]|$)'
                    r'|([{}\[\],:]))')


def partial_object(text: str) -> dict[str, Any]:
    """The longest prefix of text that closes into a JSON object, closed and parsed; {} when none does."""
    closers: list[str] = []
    key_next: list[bool] = []  # per open container: an object expecting a key (its next string is one)
    best = ""
    pos = 0
    while (m := _TOKEN.match(text, pos)) is not None:
        pos = m.end()
        string, scalar, punct = m.groups()
        if punct in ("{", "["):
            closers.append("}" if punct == "{" else "]")
            key_next.append(punct == "{")
        elif punct in ("}", "]"):
            if not closers or closers.pop() != punct:
                break
            key_next.pop()
        elif punct == ",":
            if key_next and closers[-1] == "}":
                key_next[-1] = True
            continue
        elif punct == ":" or (string is not None and key_next and key_next[-1]):
            if key_next:
                key_next[-1] = False
            continue  # a key, or the colon after it: nothing whole to keep yet
        if not closers:  # the top-level value is whole
            best = text[:pos]
            break
        best = text[:pos] + "".join(reversed(closers))
    try:
        value = json.loads(best) if best else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
