"""DeepSeek V3.2's and V4's DSML calls (engine/toolformats/dsml.py): recognised from the template or mlx-lm's
chat template type, parsed from the markup DeepSeek's encoding writes, and read when cut short."""

from __future__ import annotations

from typing import Any

import pytest

from engine.toolformats import format_name, format_named

DSML, V4 = format_named("dsml"), format_named("dsml_v4")

# As encoding_dsv32.py's encode_arguments_to_dsml and tool_call_template write two calls (between the markers).
MARKUP = ('\n<｜DSML｜invoke name="get_weather">\n'
          '<｜DSML｜parameter name="city" string="true">Paris\n  (France)</｜DSML｜parameter>\n'
          '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
          '<｜DSML｜parameter name="where" string="false">{"lat": 1.5, "tags": ["a", "b"]}</｜DSML｜parameter>\n'
          '<｜DSML｜parameter name="zip" string="true">007</｜DSML｜parameter>\n'
          '</｜DSML｜invoke>\n'
          '<｜DSML｜invoke name="get_time">\n\n</｜DSML｜invoke>\n')
CALLS = [{"name": "get_weather", "arguments": {"city": "Paris\n  (France)", "days": 3,
                                               "where": {"lat": 1.5, "tags": ["a", "b"]}, "zip": "007"}},
         {"name": "get_time", "arguments": {}}]


class Tok:
    def __init__(self, template: str | None, init_kwargs: dict[str, Any] | None = None):
        self.chat_template, self.init_kwargs, self.tool_parser = template, init_kwargs or {}, None

    def get_vocab(self) -> dict[str, int]:
        return {}


def test_dsml_is_recognised_from_the_template_or_mlx_lm_s_chat_template_type() -> None:
    from engine.zoo import formats

    assert format_name(Tok(formats.template(formats.SPEECH["deepseek-v3.2-tools"]))) == "dsml"
    v4 = "{{ '\\n\\n<' + dsml_token + 'tool_calls>\\n' }}{%- set dsml_token = '｜DSML｜' -%}"
    assert format_name(Tok(v4)) == "dsml_v4"
    # V3.2 as mlx-lm serves it: its encoding in Python, no template text
    assert format_name(Tok(None, {"chat_template_type": "deepseek_v32"})) == "dsml"
    assert format_name(Tok(None, {"chat_template_type": "muse_spark"})) == ""
    assert (DSML.start, DSML.end, V4.start, V4.end) == ("<｜DSML｜function_calls>", "</｜DSML｜function_calls>",
                                                        "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>")


def test_dsml_calls_parse_from_the_encoding_s_markup() -> None:
    assert DSML.parse(MARKUP, None) == V4.parse(MARKUP, None) == CALLS
    # a string="false" value that is no JSON stays the model's words; without the attribute the schema decides
    loose = ('<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="n" string="false">many</｜DSML｜parameter>\n'
             '<｜DSML｜parameter name="s">12</｜DSML｜parameter>\n<｜DSML｜parameter name="k">12</｜DSML｜parameter>\n'
             '</｜DSML｜invoke>')
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"s": {"type": "string"}, "k": {"type": "integer"}}}}}]
    assert DSML.parse(loose, tools) == [{"name": "f", "arguments": {"n": "many", "s": "12", "k": 12}}]


def test_an_invoke_cut_before_its_closing_tag_is_no_call() -> None:
    cut = MARKUP.split('<｜DSML｜invoke name="get_time">')[0] + '<｜DSML｜invoke name="get_time">\n'
    assert DSML.parse(cut, None) == CALLS[:1]
    for bad in ('<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Pa', "hello",
                '<｜DSML｜invoke name="">\n</｜DSML｜invoke>'):
        with pytest.raises(ValueError):
            DSML.parse(bad, None)


def test_a_cut_call_gives_its_name_and_a_prefix_of_its_arguments() -> None:
    whole = '{"city": "Paris", "days": 3}'
    head = '\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
    assert DSML.partial('\n<｜DSML｜invoke name="get_wea') == (None, "")
    assert DSML.partial('\n<｜DSML｜invoke name="get_weather">') == ("get_weather", "{")
    for text in (head, head + '<｜DSML｜parameter name="days" string="false">', head + "<｜DSML｜param"):
        name, args = DSML.partial(text)
        assert name == "get_weather" and whole.startswith(args) and args.startswith('{"city": "Paris"')
    assert DSML.partial(head.replace("Paris</｜DSML｜parameter>\n", "Par")) == ("get_weather", '{"city": "Par')
    assert DSML.partial(head + '<｜DSML｜parameter name="days" string="false">3')[1] == whole[:-1]
    assert DSML.partial(MARKUP) == (None, "")  # every invoke closed: nothing cut
