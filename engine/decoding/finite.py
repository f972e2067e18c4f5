"""Whether a JSON schema has a finite value at all.

A schema whose references require themselves without end (an object that must hold another of
itself, an array that must hold at least one of itself) still compiles into a grammar, but that
grammar has no finished string: its forced start is endless, which llguidance only discovers after
the first token (its matcher then refuses a token its own mask allowed), or a model writes it until
max_tokens. Rank 0 refuses such a schema before anything is generated.

The analysis over-approximates: a keyword it does not model counts as satisfiable, so it refuses only
schemas that certainly have no finite value (its answer is a least fixed point over the references).
"""

from __future__ import annotations

import math
import re
from typing import Any
from urllib.parse import unquote

# Node visits one analysis may spend: past it, the schema counts as satisfiable (llguidance's own
# limits still apply to it). Counted in visits rather than seconds, so every machine answers alike.
MAX_VISITS = 200_000
_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")


class _GiveUp(Exception):
    """The schema uses something the analysis does not follow, or costs too much: no verdict."""


def endless_ref(schema: Any) -> str | None:
    """The local $ref through which schema has no finite value, or None when it has one (or when
    the analysis cannot tell)."""
    try:
        return _Analysis(schema).endless()
    except (_GiveUp, RecursionError):
        return None


class _Analysis:
    def __init__(self, root: Any):
        self.root = root
        self.finite: set[str] = set()  # references proven to have a finite value
        self.seen: dict[str, None] = {}  # references met, in the order met
        self.visits = 0
        self.blocked: str | None = None  # the first unproven reference the last pass needed

    def endless(self) -> str | None:
        while True:
            self.blocked = None
            if self._has_value(self.root):  # also meets the references the root needs
                return None
            known = len(self.finite), len(self.seen)
            # Newest first: a chain of definitions, each needing the next, settles in one pass.
            for ref in reversed(list(self.seen)):
                if ref not in self.finite and self._has_value(self._resolve(ref)):
                    self.finite.add(ref)
            if (len(self.finite), len(self.seen)) == known:
                return self.blocked or "#"

    def _resolve(self, ref: str) -> Any:
        node = self.root
        for part in ref[1:].split("/")[1:] if ref != "#" else ():
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise _GiveUp  # llguidance reports an unresolvable reference itself
        return node

    def _has_value(self, node: Any) -> bool:
        """Whether node might have a finite value, given the references proven so far."""
        if node is False:
            return False
        if not isinstance(node, dict):
            return True
        self.visits += 1
        if self.visits > MAX_VISITS:
            raise _GiveUp
        if node is not self.root and "$id" in node:
            raise _GiveUp  # a nested resource resolves its references against itself
        if not self._ref_has_value(node.get("$ref")):
            return False
        if not all(self._has_value(s) for s in _schemas(node.get("allOf"))):
            return False
        for key in ("anyOf", "oneOf"):
            branches = _schemas(node.get(key))
            if branches and not any(self._has_value(s) for s in branches):
                return False
        types = node.get("type")
        types = [types] if isinstance(types, str) else types if isinstance(types, list) else _TYPES
        return any(self._type_has_value(node, t) for t in types)

    def _ref_has_value(self, ref: Any) -> bool:
        if not isinstance(ref, str):
            return True
        if ref != "#" and not ref.startswith("#/"):
            raise _GiveUp  # remote documents and anchors: not followed
        if ref in self.finite:
            return True
        self.seen.setdefault(ref, None)
        if self.blocked is None:
            self.blocked = ref
        return False

    def _type_has_value(self, node: dict[str, Any], kind: Any) -> bool:
        if kind == "object":
            return self._object_has_value(node)
        if kind == "array":
            return self._array_has_value(node)
        return True  # scalars end; contradictions among their keywords llguidance refuses itself

    def _object_has_value(self, node: dict[str, Any]) -> bool:
        properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        patterns = node.get("patternProperties") if isinstance(node.get("patternProperties"), dict) else {}
        extra = node.get("additionalProperties", True)
        required = node.get("required") if isinstance(node.get("required"), list) else []
        for name in required:
            if not isinstance(name, str):
                continue
            matched = [s for p, s in patterns.items() if _matches(p, name)]
            value = [properties[name]] if name in properties else matched or [extra]
            if not all(self._has_value(s) for s in value + matched):
                return False
        if _count(node.get("minProperties")) > len(required):
            # one more property than the required ones, of any kind the schema allows
            candidates = [s for n, s in properties.items() if n not in required] + list(patterns.values()) + [extra]
            return any(self._has_value(s) for s in candidates)
        return True

    def _array_has_value(self, node: dict[str, Any]) -> bool:
        prefix = node.get("prefixItems")
        items = node.get("items", True)
        if isinstance(items, list):  # the draft-4 spelling of prefixItems
            prefix, items = items, node.get("additionalItems", True)
        prefix = _schemas(prefix)
        least = _count(node.get("minItems"))
        if not all(self._has_value(s) for s in prefix[:least]):
            return False
        return least <= len(prefix) or self._has_value(items)


def _schemas(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _count(value: Any) -> int:
    """A minItems or minProperties as a count (what is not a positive finite number asks for none)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return 0
    return math.ceil(value)


def _matches(pattern: str, name: str) -> bool:
    try:
        return re.search(pattern, name) is not None
    except (re.error, TypeError):
        return False
