"""DeepSeek V3.2's DSML on the zoo model that speaks it (zoo-deepseek-v3.2-tools), without the engine.

Its template writes prompts exactly as mlx-lm's copy of DeepSeek's encoding does; the encoding's markup routed
by rank 0's splitter, split anywhere, gives the whole text's calls, reasoning and content with no markup in
either; and every text a forced-call grammar admits (walked one random allowed token at a time, as a model
under it would write) is a call that parses back and holds to the tool's schema.
"""

from __future__ import annotations

import json
import random
from functools import cache
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlx_lm.chat_templates import deepseek_v32 as encoding
from mlx_lm.tokenizer_utils import load

from engine.decoding.constrained import Grammars
from engine.rank0.output import OutputRules
from engine.rank0.piece import Piece
from engine.zoo import ensure_zoo_model
from tests.harness import MODEL_CACHE
from tests.integration import test_toolformats_split as split

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "note": {"type": "string", "maxLength": 12},
        "mode": {"anyOf": [{"type": "string", "enum": ["car", "bike"]}, {"type": "null"}]},
    },
    "required": ["city", "days", "note"],
    "additionalProperties": False,
}
STOPS = {"type": "object", "properties": {"stops": {"type": "array", "items": {"$ref": "#/$defs/stop"},
                                                    "minItems": 1, "maxItems": 2}},
         "required": ["stops"], "additionalProperties": False,
         "$defs": {"stop": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}},
                            "required": ["x"], "additionalProperties": False}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Forecast", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "plan_route", "description": "Route", "parameters": STOPS}},
         {"type": "function", "function": {"name": "ping", "description": "Ping"}}]
SCHEMAS = {"get_weather": WEATHER, "plan_route": STOPS, "ping": {"type": "object", "additionalProperties": False}}
PROMPT_THINKING, PROMPT = "<｜User｜>Hi<｜Assistant｜><think>", "<｜User｜>Hi<｜Assistant｜></think>"
LEAKS = ("｜", "DSML", "invoke", "parameter", "function_calls")


@cache
def tokenizer():
    return load(ensure_zoo_model("deepseek-v3.2-tools", MODEL_CACHE))


def route(text: str, cuts: list[int], tools: list[dict] | None, prompt: str, length: bool = False) -> Piece:
    return split.route(tokenizer(), text, cuts, tools, prompt, length=length)
    out.add(splitter.finish("length" if length else "stop"))
    return out


def calls(piece: Piece) -> list[tuple[str, Any]]:
    return [(c.name, json.loads(c.arguments)) for c in piece.tool_calls]


def encoded(specs: list[tuple[str, dict]]) -> str:
    """An assistant turn's calls as DeepSeek's encoding writes them (mlx-lm's copy of encoding_dsv32.py)."""
    message = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": n, "arguments": json.dumps(a)}} for n, a in specs]}
    return encoding.render_message(0, [message], thinking_mode="chat").removesuffix(encoding.eos_token)


def test_the_zoo_template_writes_prompts_as_deepseek_s_encoding_does() -> None:
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome", "days": 2,
                                                                                 "note": "a\nb", "mode": None}}}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "Checking.", "reasoning_content": "r1",
                 "tool_calls": [call, {"type": "function", "function": {"name": "ping", "arguments": {}}}]},
                {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "pong"},
                {"role": "assistant", "content": "Sunny.", "reasoning_content": "r2"},
                {"role": "user", "content": "And Oslo?"}]
    as_text = [{**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.dumps(
        c["function"]["arguments"])}} for c in m["tool_calls"]]} if "tool_calls" in m else m for m in messages]
    for thinking in (True, False):
        for n in (3, 5, 7):  # ending in calls, in their results, in a user turn
            ours = tokenizer().apply_chat_template(messages[:n], tools=TOOLS, tokenize=False,
                                                   add_generation_prompt=True, enable_thinking=thinking)
            assert ours == encoding.encode_messages(as_text[:n], "thinking" if thinking else "chat", tools=TOOLS)
    assert OutputRules(tokenizer()).parser_name == "dsml" and OutputRules(tokenizer()).format.forceable


PROSE = st.text(st.sampled_from(list("ab c.<>|=!{}\"\n")), max_size=30)
_VALUES = st.one_of(st.text(st.sampled_from(list("ab <>/\"\n{}")), max_size=12), st.integers(-99, 99),
                    st.booleans(), st.none(), st.lists(st.integers(0, 9), max_size=3))
SPECS = st.lists(st.tuples(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True),
                           st.dictionaries(st.from_regex(r"[a-z][a-z_]{0,7}", fullmatch=True), _VALUES, max_size=3)),
                 min_size=1, max_size=3)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), reasoning=PROSE, content=PROSE, specs=SPECS, thinking=st.booleans())
def test_dsml_calls_split_anywhere_are_the_whole_text_s(data, reasoning, content, specs, thinking) -> None:
    text = (f"{reasoning}</think>" if thinking else "") + content + encoded(specs)
    prompt = PROMPT_THINKING if thinking else PROMPT
    whole = route(text, [], TOOLS, prompt)
    assert calls(whole) == [(n, a) for n, a in specs]
    assert whole.reasoning == (reasoning if thinking else "")
    assert whole.content.strip() == content.strip()  # the encoding's blank line before the block stays content
    split = route(text, data.draw(st.lists(st.integers(0, len(text)), max_size=12)), TOOLS, prompt)
    assert calls(split) == calls(whole)
    assert (split.reasoning, split.content) == (whole.reasoning, whole.content)
    for routed in (split.content, split.reasoning):
        assert not any(mark in routed for mark in LEAKS), routed


def test_without_tools_the_markup_is_the_model_s_text() -> None:
    text = encoded([("ping", {})])
    assert route(text, [], None, PROMPT).content == text


def test_a_call_cut_by_max_tokens_is_reported_with_its_name_and_arguments_so_far() -> None:
    text = encoded([("get_weather", {"city": "Rome", "days": 3})])
    cut = text[:text.index('string="false">3') + len('string="false">')]
    out = route(cut, [], TOOLS, PROMPT, length=True)
    assert [(c.name, c.arguments, c.partial) for c in out.tool_calls] == [
        ("get_weather", '{"city": "Rome", "days": ', True)]
    assert out.content.strip() == ""


@cache
def grammars() -> Grammars:
    return Grammars(tokenizer())


def walk(grammar: str, seed: int) -> str:
    matcher = grammars().processor(grammar).matcher
    eos = set(tokenizer().eos_token_ids)
    rng, tokens = random.Random(seed), []
    for _ in range(2000):
        bits = matcher.compute_bitmask()
        allowed = [i for i in range(len(bits) * 8) if bits[i // 8] >> (i % 8) & 1]
        choices = [t for t in allowed if t not in eos]
        if not choices or len(choices) < len(allowed) and rng.random() < 0.5:
            break
        token = rng.choice(choices)
        assert matcher.consume_token(token), matcher.get_error()
        tokens.append(token)
    assert matcher.is_accepting()
    return tokenizer().decode(tokens)


@pytest.mark.parametrize("choice", ["required", "get_weather", "plan_route", "ping"])
def test_every_text_a_forced_grammar_admits_is_a_call_that_holds_to_its_schema(choice: str) -> None:
    named = None if choice == "required" else choice
    tool_choice = {"type": "function", "function": {"name": named}} if named else "required"
    grammar = grammars().tool_grammar(OutputRules(tokenizer()).format, TOOLS, tool_choice, parallel=named is None)
    for seed in range(6):
        text = walk(grammar, seed)
        assert text.startswith("<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"")
        assert text.endswith("</｜DSML｜invoke>\n</｜DSML｜function_calls>")
        out = route(text, list(range(0, len(text), 3)), TOOLS, PROMPT_THINKING)
        assert out.content == out.reasoning == "" and out.tool_calls, text
        for name, arguments in calls(out):
            assert named in (None, name)
            jsonschema.validate(arguments, SCHEMAS[name])
            if name == "get_weather":  # strings raw, everything else JSON, as the encoding marks them
                assert f'name="note" string="true">' in text and 'name="days" string="false">' in text


def test_v3_2_rendered_by_mlx_lm_s_own_module_is_dsml_and_takes_the_thinking_switch() -> None:
    """A V3.2 checkpoint converted for mlx-lm names its Python renderer (chat_template_type) and has no template
    text: the format and the thinking switch are read from that module."""
    from engine.rank0.reasoning import ReasoningLevels, template_source
    from engine.toolformats import format_name

    class Tok:
        chat_template, tool_parser, init_kwargs = None, None, {"chat_template_type": "deepseek_v32"}

        def get_vocab(self) -> dict[str, int]:
            return {}

    assert format_name(Tok()) == "dsml"
    assert ReasoningLevels(template_source(Tok())).options("minimal", None) == {"enable_thinking": False}


def test_a_forced_v4_call_is_written_in_its_tool_calls_block() -> None:
    from engine.toolformats import format_named

    v4 = format_named("dsml_v4")
    grammar = grammars().tool_grammar(v4, TOOLS, "required", parallel=True)
    for seed in range(3):
        text = walk(grammar, seed)
        assert text.startswith(v4.start + "\n") and text.endswith("\n" + v4.end)
        for call in v4.parse(text.removeprefix(v4.start).removesuffix(v4.end), TOOLS):
            jsonschema.validate(call["arguments"], SCHEMAS[call["name"]])
