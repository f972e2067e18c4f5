"""gpt-oss harmony and DeepSeek V3.1 output routed by rank 0's splitter, on the zoo models' own tokenizers.

Random weights never write a channel or a call section unforced, so these feed the families' real markup
through the same OutputRules and TextSplitter the scheduler uses, split at random places as tokens would
split it: the calls, the reasoning and the content are those of the whole text, and no marker reaches
content or reasoning.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlx_lm.tokenizer_utils import load

from engine.rank0.output import OutputRules, TextSplitter
from engine.rank0.piece import Piece
from engine.zoo import ensure_zoo_model
from tests.harness import MODEL_CACHE

H_CALL = "<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{args}"
H_CALL_RECIPIENT_FIRST = "<|start|>assistant to=functions.{name}<|channel|>commentary json<|message|>{args}"
# What a marker of either family may leave in text routed wrong.
LEAKS = ("<|", "|>", "to=functions", "｜", "commentary json", "constrain")


@pytest.fixture(scope="module")
def harmony():
    return load(ensure_zoo_model("gpt-oss-harmony", MODEL_CACHE))


@pytest.fixture(scope="module")
def deepseek():
    return load(ensure_zoo_model("deepseek-v3.1-tools", MODEL_CACHE))


def route(tokenizer: Any, text: str, cuts: list[int], tools: list[dict] | None, prompt: str,
          parallel: bool = True, length: bool = False) -> Piece:
    """The text fed in the pieces `cuts` makes, then finished (the end-of-sequence token is never text; with
    length, cut by max_tokens instead)."""
    rules = OutputRules(tokenizer)
    splitter = TextSplitter(rules, rules.machine(chat=True, tools=tools is not None, stop=[]),
                            rules.initial_state(tokenizer.encode(prompt, add_special_tokens=False), True),
                            tools, parallel)
    out = Piece()
    bounds = [0, *sorted(set(cuts)), len(text)]
    for a, b in zip(bounds, bounds[1:]):
        piece, ended = splitter.feed(text[a:b])
        out.add(piece)
        if ended:
            return out
    out.add(splitter.finish("length" if length else "stop"))
    return out


def calls(piece: Piece) -> list[tuple[str, Any]]:
    return [(c.name, json.loads(c.arguments)) for c in piece.tool_calls]


def no_leaks(piece: Piece) -> None:
    for text in (piece.content, piece.reasoning):
        assert not any(mark in text for mark in LEAKS), text


PROSE = st.text(st.sampled_from(list("ab c.<>|=!{}\"\n")), max_size=30).filter(
    lambda t: "<|" not in t and "|>" not in t)
NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,15}", fullmatch=True)
_LEAF = st.one_of(
    st.lists(st.sampled_from(["red", "dark blue", 'say "hi"', "a<b|c>"]), min_size=1, max_size=3, unique=True).map(
        lambda e: {"type": "string", "enum": e}),
    st.tuples(st.integers(-999, 999), st.integers(0, 500)).map(
        lambda r: {"type": "integer", "minimum": r[0], "maximum": r[0] + r[1]}),
    st.just({"type": "boolean"}),
)
SCHEMAS = st.dictionaries(st.from_regex(r"[a-z][a-z_]{0,7}", fullmatch=True), _LEAF, max_size=4)


@st.composite
def call(draw) -> tuple[str, dict, list[dict]]:
    """A tool of a random schema and arguments that hold to it."""
    name, props = draw(NAMES), draw(SCHEMAS)
    args = {}
    for key, schema in props.items():
        if "enum" in schema:
            args[key] = draw(st.sampled_from(schema["enum"]))
        elif schema["type"] == "integer":
            args[key] = draw(st.integers(schema["minimum"], schema["maximum"]))
        else:
            args[key] = draw(st.booleans())
    tool = {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": props, "required": sorted(props)}}}
    return name, args, [tool]


def cuts_of(draw_text: str):
    return st.lists(st.integers(0, len(draw_text)), max_size=12)


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
PROMPT = "<|start|>user<|message|>Hi<|end|><|start|>assistant"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), reasoning=PROSE, preamble=PROSE, spec=call(), first=st.booleans(),
       compact=st.booleans())
def test_harmony_calls_and_reasoning_split_anywhere_are_the_whole_text_s(harmony, data, reasoning, preamble, spec,
                                                                          first, compact) -> None:
    name, args, tools = spec
    text = f"<|channel|>analysis<|message|>{reasoning}<|end|>"
    if preamble:  # a commentary message to the user before the call
        text += f"<|start|>assistant<|channel|>commentary<|message|>{preamble}<|end|>"
    template = H_CALL_RECIPIENT_FIRST if first else H_CALL
    text += template.format(name=name, args=json.dumps(args, separators=(",", ":") if compact else None))
    whole = route(harmony, text, [], tools, PROMPT)
    assert calls(whole) == [(name, args)]
    assert whole.reasoning == reasoning and whole.content == preamble
    split = route(harmony, text, data.draw(cuts_of(text)), tools, PROMPT)
    assert calls(split) == calls(whole)
    assert (split.reasoning, split.content) == (whole.reasoning, whole.content)
    no_leaks(split)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), reasoning=PROSE, answer=PROSE)
def test_harmony_analysis_is_reasoning_and_final_is_content_split_anywhere(harmony, data, reasoning, answer) -> None:
    text = f"<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant<|channel|>final<|message|>{answer}"
    for tools in (None, TOOLS):
        out = route(harmony, text, data.draw(cuts_of(text)), tools, PROMPT)
        assert (out.reasoning, out.content, out.tool_calls) == (reasoning, answer, [])
        no_leaks(out)


def test_harmony_without_tools_makes_no_call_and_shows_no_markup(harmony) -> None:
    text = ("<|channel|>analysis<|message|>Need weather.<|end|>"
            + H_CALL.format(name="get_weather", args='{"city": "Paris"}'))
    out = route(harmony, text, [], None, PROMPT)
    assert (out.reasoning, out.content, out.tool_calls) == ("Need weather.", "", [])


def test_the_harmony_template_takes_reasoning_effort_and_writes_past_calls_as_the_format_reads_them(harmony) -> None:
    tools, name = TOOLS, "get_weather"
    messages = [{"role": "user", "content": "Hi"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": name, "arguments": {}}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "done"}]
    text = harmony.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True,
                                       reasoning_effort="low")
    assert "Reasoning: low\n" in text and text.endswith("<|start|>assistant")
    assert f"<|start|>assistant to=functions.{name}<|channel|>commentary json<|message|>{{}}<|call|>" in text
    past = text.split("<|start|>assistant to=functions.", 1)[1].split("<|call|>", 1)[0]
    rules = OutputRules(harmony)
    assert rules.parser(past, tools) == [{"name": name, "arguments": {}}]


DS_PROMPT_THINKING = "<｜User｜>Hi<｜Assistant｜><think>"
DS_PROMPT = "<｜User｜>Hi<｜Assistant｜></think>"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), reasoning=PROSE, content=PROSE, specs=st.lists(call(), min_size=1, max_size=3),
       thinking=st.booleans())
def test_deepseek_calls_split_anywhere_are_the_whole_text_s(deepseek, data, reasoning, content, specs,
                                                             thinking) -> None:
    tools = [tool for _, _, [tool] in specs]
    section = "".join(f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{json.dumps(a)}<｜tool▁call▁end｜>" for n, a, _ in specs)
    text = (f"{reasoning}</think>" if thinking else "") + f"{content}<｜tool▁calls▁begin｜>{section}<｜tool▁calls▁end｜>"
    prompt = DS_PROMPT_THINKING if thinking else DS_PROMPT
    whole = route(deepseek, text, [], tools, prompt)
    assert calls(whole) == [(n, a) for n, a, _ in specs]
    # the whitespace after </think> is not content
    assert whole.reasoning == (reasoning if thinking else "") and whole.content == (content.lstrip() if thinking
                                                                                    else content)
    split = route(deepseek, text, data.draw(cuts_of(text)), tools, prompt)
    assert calls(split) == calls(whole)
    assert (split.reasoning, split.content) == (whole.reasoning, whole.content)
    no_leaks(split)


def test_deepseek_v3_fenced_calls_parse_too(deepseek) -> None:
    text = ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris"}\n```'
            '<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
    out = route(deepseek, text, list(range(len(text))), TOOLS, DS_PROMPT)
    assert calls(out) == [("get_weather", {"city": "Paris"})] and out.content == ""
