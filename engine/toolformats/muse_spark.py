"""Muse Spark's format (XML_ATEM): `<atem:function_calls><atem:invoke name="NAME"><atem:parameter name="KEY">VALUE</atem:parameter></atem:invoke></atem:function_calls>`.
mlx-lm's parser reads every VALUE as JSON first (raw text only when that fails, so a raw "42" would become
a number), so the grammar writes every value as JSON, strings included.

Every end marker starts with `</atem:`, and the splitter and the parser end a call or a value at the first one,
inside a JSON string too: so no JSON string the grammar writes (a value or a key, at any depth) holds it. An enum
or const of the client's schema that does is refused by name, as the raw-text formats refuse theirs.
"""

from __future__ import annotations

import json
from typing import Any

from engine.decoding.grammar_error import GrammarError
from engine.toolformats import xml
from engine.toolformats.mlx_parsed import MlxParsed
from engine.toolformats.tools import Tool, allowed, parameters


MARKUP = xml.Markup(call="<atem:invoke name=", name=r'"([^"]+)"[^>]*>', key='<atem:parameter name="',
                    key_end='">', value="", value_end="</atem:parameter>", call_end="</atem:invoke>",
                    json_only=True)
END = "</atem:"


def avoiding(word: str) -> str:
    """A JSON-schema pattern for the strings that do not hold word (whose first character occurs only first):
    characters other than its first, and its first followed by a wrong character, each run of them possibly
    after starts of word cut short by another first character."""
    first, rest = word[0], word[1:]
    wrong = ""
    for c in reversed(rest):
        wrong = f"[^{c}{first}]" + (f"|{c}(?:{wrong})" if wrong else "")
    starts = first + (f"(?:{_prefixes(rest[:-1])})?" if len(rest) > 1 else "")
    return f"^(?:[^{first}]|(?:{starts})*{first}(?:{wrong}))*(?:{starts})*$"


def _prefixes(text: str) -> str:
    """A regex for the non-empty prefixes of text."""
    return text[0] + (f"(?:{_prefixes(text[1:])})?" if len(text) > 1 else "")


NO_END = avoiding(END)
_ANY = "#/$defs/muse_spark_any"
# any JSON whose strings and keys, at every depth, hold no end marker (llguidance reads no propertyNames: a key
# outside `properties` is kept to a pattern as a patternProperties key)
_ANY_SCHEMA = {"pattern": NO_END, "items": {"$ref": _ANY}, "patternProperties": {NO_END: {"$ref": _ANY}},
               "additionalProperties": False}


def guarded(schema: dict[str, Any], tool: Tool) -> dict[str, Any]:
    """schema with every string it admits kept free of the end markers (`pattern` constrains strings only)."""
    out = _guard(schema, tool)
    return {**out, "$defs": {**out.get("$defs", {}), "muse_spark_any": _ANY_SCHEMA}}


def _guard(node: Any, tool: Tool) -> Any:
    if node is True:
        return {"$ref": _ANY}
    if not isinstance(node, dict):  # false
        return node
    names = list(node["properties"]) if isinstance(node.get("properties"), dict) else []
    for key, held in (("enum", node.get("enum")), ("const", node.get("const")), ("a property name", names)):
        if END in json.dumps(held, ensure_ascii=False):
            raise GrammarError(f"{tool.blame[0]}: {key} holds {END!r}, which ends a value in this model's tool-call "
                               f"format; leave it out", tool.blame[1])
    out = dict(node)
    for key in ("$defs", "definitions"):
        if isinstance(out.get(key), dict):
            out[key] = {k: _guard(v, tool) for k, v in out[key].items()}
    if "$ref" in out:  # resolves to a guarded definition
        return out
    for key in ("properties", "patternProperties"):
        if isinstance(out.get(key), dict):
            out[key] = {k: _guard(v, tool) for k, v in out[key].items()}
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if isinstance(out.get(key), list):
            out[key] = [_guard(v, tool) for v in out[key]]
    if "pattern" in out:  # the client's pattern and ours (after the members are guarded: ours needs no guard)
        out["allOf"] = [*out.get("allOf", []), {"pattern": NO_END}]
    else:
        out["pattern"] = NO_END
    out["items"] = _guard(out.get("items", True), tool)
    more = out.get("additionalProperties", True)
    if more is not False and "patternProperties" not in out:  # free keys: only those the pattern admits
        out["patternProperties"], out["additionalProperties"] = {NO_END: _guard(more, tool)}, False
    elif more is not False:
        out["additionalProperties"] = _guard(more, tool)
    return out


class MuseSpark(MlxParsed):
    def grammar(self, parts: Any, tools: list[dict[str, Any]], named: str | None, parallel: bool) -> str:
        bodies = []
        for tool in allowed(tools, named):
            items = []
            for key, schema, required in parameters(tool):
                opening = json.dumps(f'<atem:parameter name="{key}">')
                item = f'{opening} {parts.json(guarded(schema, tool), tool.blame)} "</atem:parameter>"'
                items.append(item if required else f"({item})?")
            opening = json.dumps(f'<atem:invoke name="{tool.name}">')
            bodies.append(f'{opening} {" ".join(items)} "</atem:invoke>"')
        call = parts.rule(f'({" | ".join(bodies)})')
        several = "+" if parallel and named is None else ""
        return f"calls: {parts.literal(self.start)} {call}{several} {parts.literal(self.end)}"

    def partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> tuple[str | None, str]:
        return xml.partial(MARKUP, text, tools)


FORMAT = MuseSpark("muse_spark")
