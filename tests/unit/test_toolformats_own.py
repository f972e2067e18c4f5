"""The formats mlx-lm has no parser for, gpt-oss harmony and DeepSeek's: recognised from the template or the
vocabulary, parsed from the model's real markup, and their forced-call grammars (compiled by llguidance against
the zoo model's tokenizer) write only calls that parse back and hold to the tool's schema."""

from __future__ import annotations

import json
import random
from functools import lru_cache
from typing import Any

import jsonschema
import llguidance
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.toolformats import format_name, format_named
from engine.toolformats.deepseek import CALL_BEGIN, CALL_END, CALLS_BEGIN, CALLS_END, SEP
from engine.toolformats.harmony import CALL, MARKERS

HARMONY, DEEPSEEK, FENCED = format_named("harmony"), format_named("deepseek"), format_named("deepseek_v3")
# What engine/decoding/constrained.py gives a tool's schema: compact separators, unknown keywords ignored.
TOOL_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}


class Tok:
    """A tokenizer as the lookup sees one: a template, a vocabulary, mlx-lm's parser (None: it has none)."""

    def __init__(self, template: str | None, vocab: tuple[str, ...] = (), tool_parser: Any = None):
        self.chat_template, self.vocab, self.tool_parser = template, vocab, tool_parser

    def get_vocab(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.vocab)}


def test_the_formats_are_recognised_from_the_template_or_the_vocabulary() -> None:
    from engine.zoo import formats

    assert format_name(Tok(formats.template(formats.SPEECH["gpt-oss-harmony"]))) == "harmony"
    assert format_name(Tok(None, ("<|start|>", "<|channel|>", "<|message|>", "<|call|>", "<|constrain|>"))) == "harmony"
    assert format_name(Tok(formats.template(formats.SPEECH["deepseek-v3.1-tools"]))) == "deepseek"
    v3 = "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + name + '\\n```json\\n'}}"
    assert format_name(Tok(v3)) == "deepseek_v3"
    assert format_name(Tok(None, (CALLS_BEGIN, CALL_BEGIN))) == "deepseek"
    # a ChatML template says nothing of either; and where mlx-lm has a parser, it is mlx-lm's choice
    assert format_name(Tok("{{ '<|im_start|>' }}", ("<|im_start|>",))) == ""
    assert format_name(Tok(formats.template(formats.SPEECH["gpt-oss-harmony"]), tool_parser=_json_tools)) == \
        "json_tools"


def _json_tools(text: str, tools: Any) -> Any:
    return None


_json_tools.__module__ = "mlx_lm.tool_parsers.json_tools"


def test_harmony_calls_parse_with_the_recipient_before_or_after_the_channel() -> None:
    args = {"city": "Paris", "days": 2}
    for text in ('get_weather <|constrain|>json<|message|>{"city": "Paris", "days": 2}',
                 'get_weather<|channel|>commentary json<|message|>{"city":"Paris","days":2}',
                 'get_weather<|channel|>commentary <|constrain|>json<|message|> {"city": "Paris", "days": 2} '):
        assert HARMONY.parse(text, None) == [{"name": "get_weather", "arguments": args}]
    for bad in ("get_weather <|constrain|>json", '<|message|>{"a": 1}', "f <|constrain|>json<|message|>[1]",
                'f <|constrain|>json<|message|>{"a": '):
        with pytest.raises(ValueError):
            HARMONY.parse(bad, None)


def test_harmony_partial_calls_give_the_name_once_whole() -> None:
    assert HARMONY.partial("get_wea") == (None, "")
    assert HARMONY.partial("get_weather <|constrain|>js") == ("get_weather", "")
    assert HARMONY.partial('get_weather<|channel|>commentary json<|message|>{"city": "Pa') == \
        ("get_weather", '{"city": "Pa')


def test_deepseek_calls_parse_in_v3_1_and_v3_markup() -> None:
    v31 = (f'{CALL_BEGIN}get_weather{SEP}{{"city": "Paris"}}{CALL_END}'
           f'{CALL_BEGIN}get_time{SEP}{{}}{CALL_END}')
    assert DEEPSEEK.parse(v31, None) == [{"name": "get_weather", "arguments": {"city": "Paris"}},
                                         {"name": "get_time", "arguments": {}}]
    v3 = (f'{CALL_BEGIN}function{SEP}get_weather\n```json\n{{"city": "Paris"}}\n```{CALL_END}\n'
          f'{CALL_BEGIN}function{SEP}get_time\n```json\n{{}}\n```{CALL_END}')
    assert FENCED.parse(v3, None) == DEEPSEEK.parse(v3, None) == DEEPSEEK.parse(v31, None)
    # a call cut before its end marker is no call; the whole ones before it are
    assert DEEPSEEK.parse(v31 + f'{CALL_BEGIN}get_weather{SEP}{{"ci', None) == DEEPSEEK.parse(v31, None)
    for bad in (f'{CALL_BEGIN}get_weather{SEP}{{"ci', f"{CALL_BEGIN}get_weather{CALL_END}",
                f"{CALL_BEGIN}f{SEP}[1]{CALL_END}", f"{CALL_BEGIN}{SEP}{{}}{CALL_END}"):
        with pytest.raises(ValueError):
            DEEPSEEK.parse(bad, None)


def test_deepseek_partial_calls() -> None:
    assert DEEPSEEK.partial(f'{CALL_BEGIN}get_weather{SEP}{{"city": "Pa') == ("get_weather", '{"city": "Pa')
    assert DEEPSEEK.partial(f"{CALL_BEGIN}get_wea") == (None, "")
    assert DEEPSEEK.partial(f'{CALL_BEGIN}function{SEP}get_weather\n```json\n{{"ci') == ("get_weather", '{"ci')
    assert DEEPSEEK.partial(f"{CALL_BEGIN}f{SEP}{{}}{CALL_END}") == (None, "")


# ---- grammars, compiled against the zoo models' tokenizers (no MLX: the tokenizers library alone)


@lru_cache(maxsize=None)
def _tokenizer(name: str):
    import llguidance.hf  # it loads transformers: only when a grammar test runs
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    from engine.modelgen.tokenizer import train_tokenizer
    from engine.zoo import formats
    from engine.zoo.store import VOCAB

    speech = formats.SPEECH[name]
    tok = train_tokenizer(VOCAB, 0)
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in speech.special])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in speech.added])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok)
    eos = tok.token_to_id(speech.eos[0])
    return hf, llguidance.hf.from_tokenizer(hf, eos_token=eos), eos


class Parts:
    """The least of engine/decoding/constrained.py's GrammarParts: special markers by id, JSON by schema."""

    def __init__(self, hf: Any, ll: llguidance.LLTokenizer):
        self.hf, self.ll = hf, ll

    def literal(self, text: str) -> str:
        ids = self.hf.encode(text, add_special_tokens=False)
        return f"<[{ids[0]}]>" if len(ids) == 1 and self.ll.is_special_token(ids[0]) else json.dumps(text)

    def json(self, schema: dict[str, Any], blame: tuple[str, str] | None = None) -> str:
        return f"%json {json.dumps({**schema, 'x-guidance': TOOL_OPTIONS})}"

    def text(self, stop: str) -> str:
        raise NotImplementedError


def _sample(grammar: str, model: str, seed: int) -> str:
    """Text the grammar admits, one random allowed token at a time, as a model under it would write."""
    hf, ll, eos = _tokenizer(model)
    matcher = llguidance.LLMatcher(ll, "start: calls\n" + grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    rng, tokens = random.Random(seed), []
    for _ in range(600):
        mask = matcher.compute_bitmask()
        allowed = [i for i in range(len(mask) * 8) if mask[i // 8] >> (i % 8) & 1 and i < ll.vocab_size]
        token = rng.choice(allowed)
        if token == eos:
            return hf.decode(tokens, skip_special_tokens=False)
        assert matcher.consume_token(token), matcher.get_error()
        tokens.append(token)
    raise AssertionError(f"no end after 600 tokens: {hf.decode(tokens)!r}")


_LEAF = st.one_of(
    st.lists(st.sampled_from(["red", "dark blue", "élan", 'say "hi"', "a\\b"]), min_size=1, max_size=3,
             unique=True).map(lambda e: {"type": "string", "enum": e}),
    st.tuples(st.integers(-999, 999), st.integers(0, 500)).map(
        lambda r: {"type": "integer", "minimum": r[0], "maximum": r[0] + r[1]}),
    st.just({"type": "boolean"}),
    st.just({"type": "array", "items": {"type": "string", "enum": ["x", "y"]}, "maxItems": 2}),
)
SCHEMAS = st.dictionaries(st.from_regex(r"[a-z][a-z_]{0,7}", fullmatch=True), _LEAF, max_size=4).map(
    lambda props: {"type": "object", "properties": props, "required": sorted(props), "additionalProperties": False})
NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,15}", fullmatch=True)


def _tools(names: list[str], schemas: list[dict]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in zip(names, schemas)]


def _check(calls: list[dict[str, Any]], tools: list[dict[str, Any]], named: str | None) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert calls
    for call in calls:
        assert call["name"] in schemas and (named is None or call["name"] == named)
        jsonschema.validate(call["arguments"], schemas[call["name"]])


TOOLS_AND_CHOICE = st.lists(NAMES, min_size=1, max_size=3, unique=True).flatmap(
    lambda names: st.tuples(st.just(names), st.lists(SCHEMAS, min_size=len(names), max_size=len(names)),
                            st.sampled_from([None, *names]), st.booleans(), st.integers(0, 2**16)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TOOLS_AND_CHOICE)
def test_a_forced_harmony_call_is_the_model_s_own_envelope_and_parses_back(case) -> None:
    names, schemas, named, parallel, seed = case
    tools = _tools(names, schemas)
    hf, ll, _ = _tokenizer("gpt-oss-harmony")
    text = _sample(HARMONY.grammar(Parts(hf, ll), tools, named, parallel), "gpt-oss-harmony", seed)
    assert text.startswith("<|channel|>commentary to=functions.") and text.endswith(CALL)
    body = text.removeprefix("<|channel|>commentary to=functions.").removesuffix(CALL)
    assert "<|constrain|>json<|message|>" in body
    _check(HARMONY.parse(body, tools), tools, named)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TOOLS_AND_CHOICE, st.sampled_from([DEEPSEEK, FENCED]))
def test_a_forced_deepseek_call_is_the_template_s_markup_and_parses_back(case, fmt) -> None:
    names, schemas, named, parallel, seed = case
    tools = _tools(names, schemas)
    hf, ll, _ = _tokenizer("deepseek-v3.1-tools")
    text = _sample(fmt.grammar(Parts(hf, ll), tools, named, parallel), "deepseek-v3.1-tools", seed)
    assert text.startswith(CALLS_BEGIN + CALL_BEGIN) and text.endswith(CALL_END + CALLS_END)
    calls = fmt.parse(text.removeprefix(CALLS_BEGIN).removesuffix(CALLS_END), tools)
    _check(calls, tools, named)
    assert len(calls) == 1 or (parallel and named is None)
    assert ("```json" in text) == (fmt is FENCED)


def test_harmony_markers_are_the_zoo_tokenizer_s_special_tokens() -> None:
    hf, ll, _ = _tokenizer("gpt-oss-harmony")
    for marker in MARKERS:
        ids = hf.encode(marker, add_special_tokens=False)
        assert len(ids) == 1 and ll.is_special_token(ids[0]), marker
