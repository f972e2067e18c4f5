"""Arguments written as one separated list of items, `k1=v1, k2=v2` (pythonic) or `{k1:v1,k2:v2}` (Gemma): the
grammar of such a list when some items may be left out, so that separators come only between written items.

For items 1..n, `first_i` writes items i..n when none came before and `rest_i` when one did (each of its
items then preceded by the separator); a required item must be written, an optional one may be skipped.
Linear in the number of items, where listing every subset would be exponential.
"""

from __future__ import annotations

import json
from typing import Any


def separated(parts: Any, items: list[tuple[str, bool]], separator: str) -> str:
    """A lark expression for items, (lark expression, required) in their order, joined by separator."""
    first, rest = '""', '""'  # the lists of no items
    sep = json.dumps(separator)
    for item, required in reversed(items):
        new_rest = parts.rule(f"{sep} {item} {rest}" if required else f"{sep} {item} {rest} | {rest}")
        first = parts.rule(f"{item} {rest}" if required else f"{item} {rest} | {first}")
        rest = new_rest
    return first
