"""A tool call cut by max_tokens, read from every prefix of hand-written json_tools markup."""

from __future__ import annotations

import json

from engine.rank0.cut_call import cut_call
from engine.toolformats import format_named
from engine.toolformats.base import ToolFormat

NAME = "get_weather"
ARGUMENTS = '{"city": "Paris", "note": "a \\"quoted\\" word", "days": [1, 2]}'
CALL = f'\n{{"name": "{NAME}", "arguments": {ARGUMENTS}}}\n'
# the call text up to and including the name's closing quote
NAMED = CALL.index(NAME) + len(NAME) + 1


def test_every_prefix_before_the_name_closes_gives_no_call():
    for cut in range(NAMED):
        assert cut_call(format_named("json_tools"), CALL[:cut]) is None, CALL[:cut]


def test_every_prefix_after_the_name_gives_the_name_and_the_arguments_written_so_far():
    for cut in range(NAMED, len(CALL) + 1):
        call = cut_call(format_named("json_tools"), CALL[:cut])
        assert call is not None and call.partial and call.id.startswith("call_")
        assert call.name == NAME
        # the arguments are a prefix of the real ones: never a character of the envelope around them
        assert ARGUMENTS.startswith(call.arguments), (CALL[:cut], call.arguments)
        written = CALL[:cut].split('"arguments": ', 1)
        assert call.arguments == (written[1][:len(ARGUMENTS)] if len(written) == 2 else "")


def test_complete_arguments_in_an_unclosed_envelope_are_valid_json():
    call = cut_call(format_named("json_tools"), CALL[:CALL.index(ARGUMENTS) + len(ARGUMENTS)])
    assert call is not None and json.loads(call.arguments)["days"] == [1, 2]


def test_an_escaped_name_is_unescaped():
    call = cut_call(format_named("json_tools"), '{"name": "a\\u00e9b", "arguments": {"x')
    assert call is not None and (call.name, call.arguments) == ("a\u00e9b", '{"x')


def test_a_format_without_a_reader_and_a_broken_name_give_no_call():
    assert cut_call(ToolFormat(), "<function=get_weather>\n<parameter=city>\nPar") is None
    assert cut_call(format_named("json_tools"), '{"name": "bad\\q", "arguments": {') is None
    assert cut_call(format_named("json_tools"), '{"name": "", "arguments": {') is None
    assert cut_call(format_named("json_tools"), 'not a call') is None
