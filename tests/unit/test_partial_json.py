"""A cut-off JSON text read as the object it already holds, at every prefix, as the Anthropic SDK reads it."""

from __future__ import annotations

import json

import pytest

from api.partial_json import partial_object

TEXTS = [
    json.dumps({"city": "Paris", "note": 'a "q" \\ w \u00e9', "days": [1, 22, {"x": True, "y": None}],
                "n": -1500.25e3, "o": {}, "z": [[], [False]]}),
    '{ "a" : 0 , "b":[ 1 ,2 ] , "c" : "x" }',
]


@pytest.mark.parametrize("text", TEXTS)
def test_every_prefix_reads_as_the_anthropic_sdk_reads_a_cut_stream(text):
    jiter = pytest.importorskip("jiter")  # what the anthropic SDK parses input_json_delta with
    for cut in range(1, len(text) + 1):
        assert partial_object(text[:cut]) == jiter.from_json(text[:cut].encode(), partial_mode=True), text[:cut]


def test_a_cut_string_is_left_out_and_nothing_becomes_an_error():
    assert partial_object('{"city": "Par') == {}
    assert partial_object('{"city": "Paris", "days": [1, 2') == {"city": "Paris", "days": [1, 2]}
    for text in ["", "   ", "{", '{"a"', '{"a":', "[1, 2", '"text', "nonsense", '{"a": 1}}}', '{"a" "b"}']:
        assert isinstance(partial_object(text), dict), text
