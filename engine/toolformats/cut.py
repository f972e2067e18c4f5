"""What every format's reader of a cut call needs: text cut inside a marker, and JSON cut inside its value.

A cut call ends wherever max_tokens fell, inside a marker too when the tokenizer spells it in pieces: the
part of a marker written so far is markup, never arguments.
"""

from __future__ import annotations

import json


def held(text: str, marker: str) -> str:
    """text without the start of marker it ends with (the marker cut after its first characters)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return text[:-k]
    return text


def json_so_far(text: str, end: str) -> str:
    """The JSON arguments text written so far, from text that may run on into the marker `end`: the whole
    value once complete (nothing of what follows it), else the text without a cut start of `end`."""
    text = text.lstrip()
    try:
        _, stop = json.JSONDecoder().raw_decode(text)
        return text[:stop]
    except json.JSONDecodeError:
        return held(text.split(end, 1)[0], end) if end else text


def pair(key: str, value: object) -> str:
    """One whole `"key": value` of the arguments' JSON object, as json.dumps writes it."""
    return f"{json.dumps(key, ensure_ascii=False)}: {json.dumps(value, ensure_ascii=False)}"


def open_string(key: str, value: str) -> str:
    """`"key": "value so far` of a raw-text value still being written (its closing quote not yet)."""
    return f"{json.dumps(key, ensure_ascii=False)}: {json.dumps(value, ensure_ascii=False)[:-1]}"
