"""Which JSON schemas have a finite value: rank 0 refuses the others before generating anything."""

from __future__ import annotations

import pytest

from engine.decoding.finite import MAX_VISITS, endless_ref

ENDLESS = {
    "object holding itself": ({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}, "#"),
    "non-empty array of itself": ({"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 1}},
                                   "$ref": "#/$defs/n"}, "#/$defs/n"),
    "only a reference to itself": ({"$ref": "#"}, "#"),
    "either branch holds itself": ({"anyOf": [
        {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
        {"type": "array", "items": {"$ref": "#"}, "minItems": 1}]}, "#"),
    "two definitions requiring each other": ({"$defs": {
        "a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},
        "b": {"type": "array", "items": {"$ref": "#/$defs/a"}, "minItems": 2}}, "$ref": "#/$defs/a"}, "#/$defs/a"),
    "old definitions": ({"definitions": {"n": {"type": "object", "properties": {"n": {"$ref": "#/definitions/n"}},
                                               "required": ["n"]}}, "$ref": "#/definitions/n"}, "#/definitions/n"),
    "at least one more property of itself": ({"type": "object", "additionalProperties": {"$ref": "#"},
                                              "minProperties": 1}, "#"),
    "a required name matching a pattern": ({"type": "object", "patternProperties": {"^a": {"$ref": "#"}},
                                            "required": ["ab"]}, "#"),
    "a tuple starting with itself": ({"type": "array", "prefixItems": [{"$ref": "#"}], "minItems": 1}, "#"),
    "an escaped definition name": ({"$defs": {"a/b": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a~1b"}},
                                                      "required": ["x"]}}, "$ref": "#/$defs/a~1b"}, "#/$defs/a~1b"),
}

FINITE = {
    "linked list with an optional next": {"type": "object", "properties": {"v": {"type": "integer"},
                                                                          "next": {"$ref": "#"}}, "required": ["v"]},
    "tree whose children may be empty": {"type": "object", "properties": {
        "children": {"type": "array", "items": {"$ref": "#"}}}, "required": ["children"]},
    "recursion with a null way out": {"type": ["object", "null"], "properties": {"a": {"$ref": "#"}},
                                      "required": ["a"]},
    "untyped, so a string will do": {"properties": {"a": {"$ref": "#"}}, "required": ["a"]},
    "a chain of definitions ending in a string": {"$defs": {
        **{f"d{i}": {"type": "object", "properties": {"x": {"$ref": f"#/$defs/d{i + 1}"}}, "required": ["x"]}
           for i in range(60)}, "d60": {"type": "string"}}, "$ref": "#/$defs/d0"},
    "an alternative that ends": {"anyOf": [{"$ref": "#/$defs/loop"}, {"type": "string"}],
                                 "$defs": {"loop": {"type": "array", "items": {"$ref": "#"}, "minItems": 1}}},
    "plain object": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
    "boolean true": True,
}

# Where the analysis cannot follow, it gives no verdict (llguidance then judges the schema itself).
UNKNOWN = {
    "a remote reference": {"$ref": "https://example.com/schema.json"},
    "an anchor": {"$ref": "#node", "$defs": {"n": {"$anchor": "node"}}},
    "a nested resource": {"properties": {"a": {"$id": "https://x/y", "$ref": "#"}}, "required": ["a"],
                          "type": "object"},
    "a missing definition": {"$ref": "#/$defs/nothing"},
    "an infinite minItems": {"type": "array", "items": {"$ref": "#"}, "minItems": float("inf")},
}


@pytest.mark.parametrize("schema, ref", ENDLESS.values(), ids=ENDLESS.keys())
def test_a_schema_whose_every_value_nests_without_end_is_named(schema, ref):
    assert endless_ref(schema) == ref


@pytest.mark.parametrize("schema", FINITE.values(), ids=FINITE.keys())
def test_a_schema_with_a_finite_value_passes(schema):
    assert endless_ref(schema) is None


@pytest.mark.parametrize("schema", UNKNOWN.values(), ids=UNKNOWN.keys())
def test_what_the_analysis_does_not_follow_is_never_refused(schema):
    assert endless_ref(schema) is None


def test_the_analysis_stops_at_its_budget_of_visits():
    # Thousands of definitions, each needing the next: too costly to settle, so no verdict.
    count = 3 * int(MAX_VISITS ** 0.5)
    defs = {f"d{i}": {"type": "object", "properties": {"x": {"$ref": f"#/$defs/d{i + 1}"}}, "required": ["x"]}
            for i in range(count)}
    defs[f"d{count}"] = {"$ref": "#/$defs/d0"}
    assert endless_ref({"$defs": defs, "$ref": "#/$defs/d0"}) is None
