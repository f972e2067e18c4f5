"""Arguments written as one separated list of items, `k1=v1, k2=v2` (pythonic) or `{k1:v1,k2:v2}` (Gemma): the
grammar of such a list when some items may be left out, so that separators come only between written items.

For items 1..n, `first_i` writes items i..n when none came before and `rest_i` when one did (each of its
items then preceded by the separator); a required item must be written, an optional one may be skipped.
Linear in the number of items, where listing every subset would be exponential. `cut_items` reads such a
list cut short by max_tokens.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from engine.toolformats.cut import held, open_string, pair
from engine.toolformats.tools import allowed, parameters


def separated(parts: Any, items: list[tuple[str, bool]], separator: str) -> str:
    """A lark expression for items, (lark expression, required) in their order, joined by separator."""
    first, rest = '""', '""'  # the lists of no items
    sep = json.dumps(separator)
    for item, required in reversed(items):
        new_rest = parts.rule(f"{sep} {item} {rest}" if required else f"{sep} {item} {rest} | {rest}")
        first = parts.rule(f"{item} {rest}" if required else f"{item} {rest} | {first}")
        rest = new_rest
    return first


def braced_calls(fmt: Any, parts: Any, tools: list[dict[str, Any]], named: str | None, parallel: bool,
                 value: Callable[[Any, str, dict[str, Any]], str]) -> str:
    """The grammar of Gemma's calls, `START call:NAME{key:VALUE,...} END` (one, or several when parallel and not
    named), for fmt's markers; value(tool, key, schema) writes one parameter's VALUE in the family's own way."""
    bodies = []
    for tool in allowed(tools, named):
        items = [(f"{json.dumps(key + ':')} {value(tool, key, schema)}", required)
                 for key, schema, required in parameters(tool)]
        bodies.append(f'{json.dumps("call:" + tool.name + "{")} {separated(parts, items, ",")} "}}"')
    call = parts.rule(f'{parts.literal(fmt.start)} ({" | ".join(bodies)}) {parts.literal(fmt.end)}')
    return f"calls: {call}+" if parallel and named is None else f"calls: {call}"


def cut_items(text: str, assign: str, quote: str = "") -> tuple[str, bool]:
    """The arguments of a list cut short, `k1=v1, k2=v2...` (assign "=") up to the bracket closing it, as a
    prefix of their JSON object: closed items decoded (a value between `quote` markers is raw text, any other
    JSON), then the open item's key and value so far. The bool: whether the list's closing bracket came."""
    items, closed = top_level(text, quote)
    out = []
    for i, item in enumerate(items):
        key, assigned, value = item.partition(assign)
        key, value, last = key.strip(), value.strip(), i == len(items) - 1 and not closed
        if not assigned or not key:
            break
        if quote and value.startswith(quote):
            text_value, ended, _ = value[len(quote):].partition(quote)
            out.append(pair(key, text_value) if ended else open_string(key, held(text_value, quote)))
        elif last:
            written = "" if quote and quote.startswith(value) else value  # a quote marker cut after its start
            out.append(f"{json.dumps(key, ensure_ascii=False)}: {written}")
        else:
            try:
                out.append(pair(key, json.loads(value)))
            except ValueError:
                out.append(pair(key, value))  # not JSON: the model's own words
    return "{" + ", ".join(out), closed


def top_level(text: str, quote: str) -> tuple[list[str], bool]:
    """text split at its top-level commas up to its first unmatched closing bracket (JSON strings and text
    between quote markers skipped), and whether that bracket came."""
    items, depth, start, i, string = [], 0, 0, 0, ""
    while i < len(text):
        if string:
            if string == '"' and text[i] == "\\":
                i += 2
                continue
            if text.startswith(string, i):
                i, string = i + len(string), ""
                continue
        elif quote and text.startswith(quote, i) or text[i] == '"':
            string = quote if quote and text.startswith(quote, i) else '"'
            i += len(string)
            continue
        elif text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            if depth == 0:
                return [*items, text[start:i]], True
            depth -= 1
        elif text[i] == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
        i += 1
    return [*items, text[start:]], False


def cut_braced(text: str, quote: str) -> tuple[str | None, str]:
    """Gemma's cut call, `call:NAME{key:<quote>text<quote>,key:3...`: its name once the brace opens, and its
    arguments so far."""
    head = _BRACED.match(text)
    if head is None:
        return None, ""
    arguments, closed = cut_items(text[head.end():], ":", quote)
    return head.group(1), arguments + ("}" if closed else "")


_BRACED = re.compile(r"\s*call:([\w.\-]+)\{")
