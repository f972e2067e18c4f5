"""Property tests over every tool-call format: a call written by the format's own forced grammar, for random
bounded tool schemas, splits into the same calls, content and reasoning however its text reaches rank 0's
splitter, and none of the format's markup reaches content or reasoning.

Each example draws tools, compiles the forced-call grammar on the format's zoo tokenizer and walks its
matcher with random allowed tokens (as a random model under the mask would write), after some prose (and
reasoning, where the tokenizer has think markers) of characters that look like markup. The tokens then reach
a TextSplitter three ways: token by token through mlx-lm's streaming detokenizer (as the scheduler feeds it),
as the whole text at once, and in random pieces. The formats come from the zoo (engine/zoo/tool_models.py),
so a format with a zoo model is covered without touching this file.
In tests/integration because the formats reuse mlx-lm's parsers, which import MLX.
"""

from __future__ import annotations

import json
import random
from functools import cache
from typing import Any

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import mlx_compat
from engine.decoding.constrained import GrammarError, Grammars
from engine.rank0.output import OutputRules, TextSplitter
from engine.rank0.piece import Piece
from engine.zoo.tool_models import TOOL_CALLING_MODELS, load_tool_model_tokenizer
from tests.harness import MODEL_CACHE

# Values that look like the markup of one format or another: angle brackets, braces, quotes, separators.
MARKUPISH = ["red", "dark blue", 'say "hi"', "a<b>c", "{x}", "it's", "1, 2", "k=v", "[a]", "</p>", "<x/>"]
KEYS = st.from_regex(r"[a-z][a-z_]{0,7}", fullmatch=True)
_ENUM = st.lists(st.sampled_from(MARKUPISH), min_size=1, max_size=3, unique=True).map(
    lambda e: {"type": "string", "enum": e})
_INT = st.tuples(st.integers(-99, 99), st.integers(0, 200)).map(
    lambda r: {"type": "integer", "minimum": r[0], "maximum": r[0] + r[1]})
_LEAF = st.one_of(
    _ENUM, _INT, st.just({"type": "boolean"}),
    st.integers(0, 8).map(lambda n: {"type": "string", "maxLength": n}),  # free text: whatever tokens come
    _INT.map(lambda s: {"anyOf": [s, {"type": "null"}]}),
    _ENUM.map(lambda s: {"type": "array", "items": s, "maxItems": 2}),
    _INT.map(lambda s: {"type": "object", "properties": {"n": s}, "required": ["n"], "additionalProperties": False}),
)
# Prose before a call: markup-like characters, but letters too few to spell any format's marker.
PROSE = st.text(st.sampled_from(list("ab <>{}\"'|=/[]:,\n")), max_size=20)


@st.composite
def tool(draw, name: str) -> dict[str, Any]:
    props = draw(st.dictionaries(KEYS, _LEAF, max_size=3))
    required = [k for k in props if draw(st.booleans())]
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": props, "required": required, "additionalProperties": False}}}


@st.composite
def tools(draw) -> list[dict[str, Any]]:
    names = draw(st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True), min_size=1, max_size=3,
                          unique=True))
    return [draw(tool(name)) for name in names]


@cache
def _zoo(model: str) -> tuple[str, Any, Grammars, OutputRules]:
    fmt, tokenizer = load_tool_model_tokenizer(model, MODEL_CACHE)
    return fmt, tokenizer, Grammars(tokenizer), OutputRules(tokenizer)


def forced_grammar(grammars: Grammars, rules: OutputRules, declared: list[dict[str, Any]], named: str | None,
                   parallel: bool) -> tuple[str | None, list[dict[str, Any]]]:
    """The grammar for the tools the format can hold (None when it holds none of them), and those tools. A tool
    it cannot hold must be refused by name, as a client would be told."""
    declared = list(declared)
    while True:
        choice = {"type": "function", "function": {"name": named}} if named else "required"
        try:
            return grammars.tool_grammar(rules.format, declared, choice, parallel), declared
        except GrammarError as err:
            assert err.param is not None and err.param.startswith("tools["), err
            i = int(err.param[len("tools["):].split("]", 1)[0])
            assert repr(declared[i]["function"]["name"]) in str(err)
            dropped = declared.pop(i)["function"]["name"]
            if dropped == named or not declared:
                return None, declared


def walk(grammars: Grammars, grammar: str, eos: set[int], rng: random.Random) -> list[int]:
    """Tokens the grammar accepts: each a random one its mask allows, ending (when it may) a third of the time."""
    matcher = grammars.processor(grammar).matcher
    tokens: list[int] = []
    for _ in range(1000):
        allowed = np.flatnonzero(np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8),
                                               bitorder="little"))
        choices = [int(t) for t in allowed if int(t) not in eos]
        if not choices or len(choices) < len(allowed) and rng.random() < 0.35:
            break
        token = rng.choice(choices)
        assert matcher.consume_token(token), matcher.get_error()
        tokens.append(token)
    assert matcher.is_accepting(), tokens
    return tokens


def framed(fmt: str, rules: OutputRules, reasoning: str | None, prose: str) -> tuple[str, str, str]:
    """(text before the call, the reasoning and the content it should give)."""
    if fmt == "harmony":  # channels: reasoning is the analysis message, content a commentary preamble
        text = f"<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant" if reasoning is not None else ""
        text += f"<|channel|>commentary<|message|>{prose}<|end|><|start|>assistant" if prose else ""
        return text, reasoning or "", prose
    if reasoning is not None and rules.think is not None:
        # the whitespace after a think block is not content
        return f"{rules.think[0]}{reasoning}{rules.think[1]}{prose}", reasoning, prose.lstrip()
    return prose, "", prose


def split(rules: OutputRules, declared: list[dict[str, Any]], parallel: bool, pieces: list[str]) -> Piece:
    initial = rules.initial_state([], True)
    splitter = TextSplitter(rules, rules.machine(chat=True, tools=True, stop=[]), initial, declared, parallel)
    out = Piece()
    for text in pieces:
        piece, ended = splitter.feed(text)
        out.add(piece)
        if ended:
            return out
    out.add(splitter.finish())
    return out


def detokenized(tokenizer: Any, tokens: list[int]) -> list[str]:
    """The text of each token as the scheduler hands it to the splitter (mlx-lm's streaming detokenizer)."""
    detok = tokenizer.detokenizer
    mlx_compat.keep_leading_space(detok)
    out = []
    for i, token in enumerate(tokens):
        detok.add_token(token)
        if i == len(tokens) - 1:
            detok.finalize()
        out.append(detok.last_segment)
    return out


def outcome(piece: Piece) -> tuple[str, str, list[tuple[str, Any]]]:
    return piece.content, piece.reasoning, [(c.name, json.loads(c.arguments)) for c in piece.tool_calls]


@pytest.mark.parametrize("model", TOOL_CALLING_MODELS)
def test_a_forced_call_splits_alike_streamed_whole_or_in_pieces(model) -> None:
    written: list[int] = []  # values in each example's calls: a format that never writes one proves little

    @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data(), declared=tools(), parallel=st.booleans(), reasoning=st.none() | PROSE, prose=PROSE,
           rng=st.randoms(use_true_random=False))
    def check(data, declared, parallel, reasoning, prose, rng) -> None:
        written.append(splits_alike(model, data, declared, parallel, reasoning, prose, rng))

    check()
    assert any(written), f"{model}: no example's call held a single value"


def splits_alike(model, data, declared, parallel, reasoning, prose, rng) -> int:
    """One example: asserts the call splits alike and validates; the number of values its calls hold."""
    fmt, tokenizer, grammars, rules = _zoo(model)
    named = data.draw(st.sampled_from([None, None, *(t["function"]["name"] for t in declared)]))
    grammar, declared = forced_grammar(grammars, rules, declared, named, parallel and named is None)
    if grammar is None:
        return 0
    before, reasoning, content = framed(fmt, rules, reasoning, prose)
    tokens = tokenizer.encode(before, add_special_tokens=False) + walk(grammars, grammar,
                                                                        set(tokenizer.eos_token_ids), rng)
    segments = detokenized(tokenizer, tokens)
    text = "".join(segments)
    whole = outcome(split(rules, declared, parallel, [text]))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12)))
    bounds = [0, *cuts, len(text)]
    assert outcome(split(rules, declared, parallel, segments)) == whole, text
    assert outcome(split(rules, declared, parallel, [text[a:b] for a, b in zip(bounds, bounds[1:])])) == whole, text
    # no markup in content or reasoning: exactly the prose written before the call
    assert whole[:2] == (content, reasoning), text
    calls = whole[2]
    assert calls and (parallel and named is None or len(calls) == 1), text
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in declared}
    for name, arguments in calls:
        assert named in (None, name)
        jsonschema.validate(arguments, schemas[name])
    return sum(len(arguments) for _, arguments in calls)


@pytest.mark.parametrize("model", TOOL_CALLING_MODELS)
def test_an_enum_value_that_looks_like_markup_is_written_whole_or_refused_by_name(model) -> None:
    fmt, tokenizer, grammars, rules = _zoo(model)
    markers = [m for m in (rules.format.start, rules.format.end) if m]
    for value in [*MARKUPISH, " padded ", *(f"a{m}b" for m in markers)]:
        declared = [{"type": "function", "function": {"name": "pick", "parameters": {
            "type": "object", "properties": {"v": {"type": "string", "enum": [value]}}, "required": ["v"],
            "additionalProperties": False}}}]
        grammar, declared = forced_grammar(grammars, rules, declared, None, False)
        if grammar is None:
            continue  # refused, naming the tool
        text = tokenizer.decode(walk(grammars, grammar, set(tokenizer.eos_token_ids), random.Random(0)))
        assert outcome(split(rules, declared, False, [text])) == ("", "", [("pick", {"v": value})]), text


def test_muse_spark_json_strings_and_keys_cannot_spell_its_end_markers() -> None:
    _, tokenizer, grammars, rules = _zoo("tools-muse_spark")
    declared = [{"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"v": {"type": "string"}, "w": {}}, "required": ["v", "w"]}}}]
    grammar = grammars.tool_grammar(rules.format, declared, "required", False)

    def accepts(text: str) -> bool:
        matcher = grammars.processor(grammar).matcher
        return all(matcher.consume_token(t) for t in tokenizer.encode(text, add_special_tokens=False))

    call = '<atem:function_calls><atem:invoke name="pick"><atem:parameter name="v">'
    assert accepts(call + '"a</atem b<</p>"</atem:parameter><atem:parameter name="w">[{"k</atem": "<<"}]')
    assert not accepts(call + '"a</atem:')  # a value's string: the splitter would end the call there
    assert not accepts(call + '"a"</atem:parameter><atem:parameter name="w">[{"</atem:')  # a key, nested
    assert not accepts(call + '"a"</atem:parameter><atem:parameter name="w">[{"k": ["</atem:')
