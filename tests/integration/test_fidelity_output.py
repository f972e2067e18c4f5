"""Rank 0's output routing on the demo tokenizer: reasoning, tool calls, stop strings, logprob texts.

Random weights almost never emit <think> or <tool_call>, so these feed the model's real tokens
and text through the same TextSplitter, detokeniser and TokenTexts the scheduler uses.
"""

from __future__ import annotations

import json

import pytest
from mlx_lm.tokenizer_utils import load

from engine.rank0.logprobs import TokenTexts
from engine.rank0.output import OutputRules, TextSplitter
from engine.rank0.piece import Piece

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def tokenizer(demo_tiny):
    return load(demo_tiny)


def route(tokenizer, pieces: list[str], *, tools=TOOLS, stop=(), parallel=True):
    """Feed text pieces; return the per-piece outputs and the final flush."""
    rules = OutputRules(tokenizer)
    machine = rules.machine(chat=True, tools=tools is not None, stop=list(stop))
    splitter = TextSplitter(rules, machine, "normal", tools, parallel)
    steps = [splitter.feed(p) for p in pieces]
    return steps, splitter.finish()


def test_the_demo_tokenizer_has_thinking_and_json_tools(tokenizer):
    rules = OutputRules(tokenizer)
    assert rules.think == ("<think>", "</think>")
    assert rules.tool == ("<tool_call>", "</tool_call>")
    assert rules.parser_name == "json_tools"


def test_reasoning_goes_to_reasoning_and_the_answer_to_content(tokenizer):
    steps, tail = route(tokenizer, ["<think>", "Paris is", " sunny", "</think>", "\n\n", "It is", " sunny."])
    reasoning = "".join(p.reasoning for p, _ in steps) + tail.reasoning
    content = "".join(p.content for p, _ in steps) + tail.content
    assert reasoning == "Paris is sunny"
    assert content == "It is sunny."  # the blank lines after </think> are not content
    # streaming: each piece leaves as soon as it is known, nothing waits for the end
    assert [p.reasoning for p, _ in steps[:3]] == ["", "Paris is", " sunny"]
    assert steps[5][0].content == "It is"


def test_a_tool_call_marker_split_across_pieces_never_reaches_content(tokenizer):
    text = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    pieces = [text[i : i + 3] for i in range(0, len(text), 3)]  # "<to", "ol_", ... as a multi-token marker would
    steps, tail = route(tokenizer, pieces)
    contents = [p.content for p, _ in steps] + [tail.content]
    assert "".join(contents) == "Let me check."
    assert not any("<" in c for c in contents)
    calls = [c for p, _ in steps for c in p.tool_calls]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert calls[0].id.startswith("call_")
    # plain content is not held back while tools are present
    assert steps[0][0].content == "Let"


def test_parallel_calls_and_the_whitespace_between_them(tokenizer):
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>'
    steps, tail = route(tokenizer, [call % "Paris", "\n", call % "Rome", "\n"])
    assert [json.loads(c.arguments)["city"] for p, _ in steps for c in p.tool_calls] == ["Paris", "Rome"]
    assert "".join(p.content for p, _ in steps) + tail.content == ""


def test_parallel_tool_calls_false_ends_after_the_first_call(tokenizer):
    call = '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
    steps, _ = route(tokenizer, [call + "\n" + call], parallel=False)
    (piece, ended), = steps
    assert ended and len(piece.tool_calls) == 1


def test_without_tools_markers_are_plain_text(tokenizer):
    steps, tail = route(tokenizer, ["<tool_call>", "x", "</tool_call>"], tools=None)
    assert "".join(p.content for p, _ in steps) + tail.content == "<tool_call>x</tool_call>"


def test_an_unparseable_call_comes_back_as_content(tokenizer):
    steps, tail = route(tokenizer, ["<tool_call>", "not json", "</tool_call>"])
    assert "".join(p.content for p, _ in steps) + tail.content == "<tool_call>not json</tool_call>"
    assert not any(p.tool_calls for p, _ in steps)


def test_a_stop_string_split_across_pieces_ends_the_text_in_any_state(tokenizer):
    steps, _ = route(tokenizer, ["Hello wo", "rld, ST", "OP here"], stop=["STOP"])
    assert [p.content for p, _ in steps[:2]] == ["Hello wo", "rld, "]
    assert steps[1][1] is False and steps[2][1] is True
    steps, _ = route(tokenizer, ["<think>", "ab", "cSTOPd"], stop=["STOP"])
    assert "".join(p.reasoning for p, _ in steps) == "abc" and steps[-1][1]


@pytest.mark.parametrize(("pieces", "stop", "matched", "content"), [
    (["Hello wo", "rld, ST", "OP here"], ["END", "STOP"], "STOP", "Hello world, "),
    (["<think>", "abEN", "D more"], ["STOP", "END"], "END", ""),  # in reasoning
    (["xA", "B"], ["B", "AB"], "AB", "x"),  # overlapping stop strings: the one that matched whole
    (["xB"], ["AB", "B"], "B", "x"),
    (["no stop here"], ["STOP"], None, "no stop here"),
])
def test_the_splitter_names_the_stop_string_that_ended_the_text(tokenizer, pieces, stop, matched, content):
    rules = OutputRules(tokenizer)
    splitter = TextSplitter(rules, rules.machine(chat=True, tools=True, stop=stop), "normal", TOOLS, True)
    steps = [splitter.feed(p) for p in pieces]
    tail = splitter.finish()
    assert splitter.stop_sequence == matched
    assert steps[-1][1] is (matched is not None)
    assert "".join(p.content for p, _ in steps) + tail.content == content
    if matched:
        assert splitter.feed("more STOP") == (Piece(), True)  # once stopped, nothing more comes out


def test_a_stop_string_inside_a_tool_call_cuts_the_call_and_is_named(tokenizer):
    rules = OutputRules(tokenizer)
    splitter = TextSplitter(rules, rules.machine(chat=True, tools=True, stop=["!!"]), "normal", TOOLS, True)
    piece, ended = splitter.feed('<tool_call>\n{"name": "get_weather", "arguments": {"x": 1}}!!\n</tool_call>')
    assert ended and splitter.stop_sequence == "!!"
    assert [(c.name, json.loads(c.arguments)) for c in piece.tool_calls] == [("get_weather", {"x": 1})]
    assert piece.content == ""


def test_token_texts_give_exact_utf8_bytes(tokenizer):
    texts = TokenTexts(tokenizer)
    for text in [" the", "Paris", "<tool_call>", "é"]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        joined = b"".join(bytes(texts.get(i)[1]) for i in ids)
        assert joined == text.encode()
    token, raw = texts.get(tokenizer.encode(" the", add_special_tokens=False)[0])
    assert (token, raw) == (" the", list(b" the"))


def test_a_call_cut_by_max_tokens_at_any_point_is_reported_with_what_was_written(tokenizer):
    arguments = '{"city": "Paris", "days": 3}'
    markup = f'Sure.<tool_call>\n{{"name": "get_weather", "arguments": {arguments}}}\n</tool_call>'
    opened = markup.index("<tool_call>") + len("<tool_call>")
    named = markup.index("get_weather") + len("get_weather") + 1
    ended = markup.index("}}") + 2
    for cut in range(len("Sure."), markup.index("</tool_call>")):
        text = markup[:cut]
        results = []
        for pieces in ([text], list(text)):  # whole, and one character per token
            steps, tail = _cut(tokenizer, pieces, "length")
            content = "".join(p.content for p, _ in steps) + tail.content
            calls = [c for p, _ in steps for c in p.tool_calls] + tail.tool_calls
            results.append((content, [(c.name, c.arguments, c.partial) for c in calls]))
        assert results[0] == results[1], text
        content, calls = results[0]
        if cut < opened:  # a start marker not yet whole is text the model wrote
            assert (content, calls) == (text, []), text
        elif cut < named:
            assert (content, calls) == ("Sure.", []), text
        elif cut < ended:
            assert content == "Sure." and len(calls) == 1, text
            name, written, partial = calls[0]
            assert (name, partial) == ("get_weather", True) and arguments.startswith(written), (text, written)
        else:  # the arguments are whole: a complete call, only its end marker is missing
            assert (content, calls) == ("Sure.", [("get_weather", arguments, False)]), text


def test_a_call_cut_by_eos_or_a_stop_string_still_counts_only_when_it_parses(tokenizer):
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"ci'
    steps, tail = _cut(tokenizer, [text], "stop")
    assert (steps[0][0], tail) == (Piece(), Piece())


def _cut(tokenizer, pieces: list[str], reason: str):
    rules = OutputRules(tokenizer)
    splitter = TextSplitter(rules, rules.machine(chat=True, tools=True, stop=[]), "normal", TOOLS, True)
    steps = [splitter.feed(p) for p in pieces]
    return steps, splitter.finish(reason)
