"""Each tool-call format on its zoo model's tokenizer, without the engine: the family's real markup parses to
its calls, and forced calls compile to grammars whose every text parses back, through the engine's own text
splitter, to calls that validate against the tool's schema.

Text the grammar accepts is drawn by walking the matcher: each step takes a random token among those its
mask allows, as the engine's sampler would from a random model (the schemas are bounded, so walks end).
In tests/integration because the formats reuse mlx-lm's parsers, which import MLX.
"""

from __future__ import annotations

import json
import random
from functools import cache

import jsonschema
import pytest

from engine.decoding.constrained import GrammarError, Grammars
from engine.rank0.output import OutputRules, TextSplitter
from engine.zoo import ensure_zoo_model
from engine.zoo.names import TOOL_FORMATS
from tests.harness import MODEL_CACHE
from tests.schemas import UNIT, weather_schema

WEATHER = weather_schema(unit=UNIT, note={"type": "string", "maxLength": 6})
# $defs and $ref, anyOf with null, an array of objects
ROUTE = {
    "type": "object",
    "properties": {
        "stops": {"type": "array", "items": {"$ref": "#/$defs/stop"}, "minItems": 1, "maxItems": 2},
        "mode": {"anyOf": [{"type": "string", "enum": ["car", "bike"]}, {"type": "null"}]},
        "fast": {"type": "boolean"},
    },
    "required": ["stops", "mode"],
    "additionalProperties": False,
    "$defs": {"stop": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                                        "tag": {"enum": ["a", "b"]}},
                       "required": ["x", "tag"], "additionalProperties": False}},
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "plan_route", "parameters": ROUTE}},
         {"type": "function", "function": {"name": "ping"}}]
SCHEMAS = {t["function"]["name"]: t["function"].get("parameters", {"type": "object", "additionalProperties": False})
           for t in TOOLS}

# What each family's model writes (from their chat templates and model cards), and the calls it means.
REAL_MARKUP = {
    "json_tools": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 3}}\n</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n<parameter=days>\n3\n"
                   "</parameter>\n</function>\n</tool_call>",
    "glm47": "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value><arg_key>days</arg_key>"
             "<arg_value>3</arg_value></tool_call>",
    "kimi_k2": '<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>'
               '{"city": "Rome", "days": 3}<|tool_call_end|><|tool_calls_section_end|>',
    "mistral": '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome", "days": 3}',
    "minimax_m2": '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Rome</parameter>\n'
                  '<parameter name="days">3</parameter>\n</invoke>\n</minimax:tool_call>',
    "longcat": "<longcat_tool_call>get_weather\n<longcat_arg_key>city</longcat_arg_key>\n<longcat_arg_value>Rome"
               "</longcat_arg_value>\n<longcat_arg_key>days</longcat_arg_key>\n<longcat_arg_value>3</longcat_arg_value>\n"
               "</longcat_tool_call>",
    "minicpm5": '<function name="get_weather"><param name="city">Rome</param><param name="days">3</param></function>',
    "muse_spark": '<atem:function_calls><atem:invoke name="get_weather"><atem:parameter name="city">Rome'
                  '</atem:parameter><atem:parameter name="days">3</atem:parameter></atem:invoke></atem:function_calls>',
    "pythonic": '<|tool_call_start|>[get_weather(city="Rome", days=3)]<|tool_call_end|>',
    "gemma4": '<|tool_call>call:get_weather{city:<|"|>Rome<|"|>,days:3}<tool_call|>',
    "function_gemma": "<start_function_call>call:get_weather{city:<escape>Rome<escape>,days:3}<end_function_call>",
    "kimi_k3": '<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|><|open|>argument key="city" '
               'type="string"<|sep|>Rome<|close|>argument<|sep|><|open|>argument key="days" type="integer"<|sep|>3'
               '<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>',
}
FORMATS = ("json_tools", *TOOL_FORMATS)
# Tools a format cannot hold: FunctionGemma's parser ends a value at the first "," (no arrays or objects).
REFUSED = {"function_gemma": {"plan_route"}}


@cache
def _tokenizer(fmt: str):
    from mlx_lm.utils import load_tokenizer

    name = "qwen3" if fmt == "json_tools" else f"tools-{fmt}"
    return load_tokenizer(ensure_zoo_model(name, MODEL_CACHE))


@cache
def _grammars(fmt: str) -> Grammars:
    return Grammars(_tokenizer(fmt))


def _split(fmt: str, text: str, parallel: bool = True):
    """The engine's splitter over text, fed in pieces of 3 characters: (content, calls)."""
    rules = OutputRules(_tokenizer(fmt))
    splitter = TextSplitter(rules, rules.machine(chat=True, tools=True, stop=[]), "normal", TOOLS, parallel)
    content, calls = "", []
    for i in range(0, len(text), 3):
        piece, ended = splitter.feed(text[i:i + 3])
        content += piece.content
        calls += piece.tool_calls
        if ended:
            break
    else:
        piece = splitter.finish()
        content += piece.content
        calls += piece.tool_calls
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


def _walk(fmt: str, grammar: str, seed: int) -> str:
    """Text the grammar accepts: random tokens among those the mask allows, until it ends (when the end is
    allowed, half the time)."""
    grammars = _grammars(fmt)
    matcher = grammars.processor(grammar).matcher
    eos = set(_tokenizer(fmt).eos_token_ids)
    rng = random.Random(seed)
    tokens: list[int] = []
    for _ in range(2000):
        bits = matcher.compute_bitmask()
        allowed = [i for i in range(len(bits) * 8) if bits[i // 8] >> (i % 8) & 1]
        choices = [t for t in allowed if t not in eos]
        if not choices or len(choices) < len(allowed) and rng.random() < 0.5:  # the end is allowed: often taken
            break
        token = rng.choice(choices)
        assert matcher.consume_token(token), matcher.get_error()
        tokens.append(token)
    assert matcher.is_accepting(), _tokenizer(fmt).decode(tokens)[-300:]
    return _tokenizer(fmt).decode(tokens)


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_zoo_model_has_the_format_and_it_can_be_forced(fmt: str) -> None:
    rules = OutputRules(_tokenizer(fmt))
    assert rules.parser_name == fmt and rules.format.forceable


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_familys_real_markup_parses_to_its_call_without_leaking(fmt: str) -> None:
    content, calls = _split(fmt, "Let me check. " + REAL_MARKUP[fmt])
    assert content == "Let me check. "
    assert calls == [("get_weather", {"city": "Rome", "days": 3})]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("choice", ["required", "get_weather", "plan_route", "ping"])
def test_every_text_a_forced_grammar_accepts_is_a_valid_call(fmt: str, choice: str) -> None:
    named = choice if choice != "required" else None
    tool_choice = {"type": "function", "function": {"name": named}} if named else "required"
    tools = [t for t in TOOLS if t["function"]["name"] not in REFUSED.get(fmt, ())]
    if named is not None and named in REFUSED.get(fmt, ()):
        with pytest.raises(GrammarError, match=f"'{named}'.*cannot be enforced in this model's tool-call format"):
            _grammars(fmt).tool_grammar(_rules_format(fmt), TOOLS, tool_choice, parallel=False)
        return
    grammar = _grammars(fmt).tool_grammar(_rules_format(fmt), tools, tool_choice, parallel=named is None)
    for seed in range(6):
        text = _walk(fmt, grammar, seed)
        content, calls = _split(fmt, text)
        assert content == "" and calls, text
        for name, arguments in calls:
            assert named in (None, name)
            jsonschema.validate(arguments, SCHEMAS[name])


@pytest.mark.parametrize("fmt", FORMATS)
def test_auto_with_a_response_format_answers_json_or_a_call(fmt: str) -> None:
    answer = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    tools = [t for t in TOOLS if t["function"]["name"] not in REFUSED.get(fmt, ())]
    grammar = _grammars(fmt).tool_grammar(_rules_format(fmt), tools, "auto", True, answer)
    kinds = set()
    for seed in range(8):
        content, calls = _split(fmt, _walk(fmt, grammar, seed))
        if calls:
            kinds.add("call")
            for name, arguments in calls:
                jsonschema.validate(arguments, SCHEMAS[name])
        else:
            kinds.add("json")
            jsonschema.validate(json.loads(content), answer)
    assert kinds  # either may come; both are valid


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_tool_schema_that_cannot_be_enforced_is_blamed_by_name(fmt: str) -> None:
    endless = {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}
    tools = [t for t in TOOLS if t["function"]["name"] not in REFUSED.get(fmt, ())]
    tools.append({"type": "function", "function": {"name": "loop", "parameters": endless}})
    with pytest.raises(GrammarError) as err:
        _grammars(fmt).tool_grammar(_rules_format(fmt), tools, "required", False)
    assert "'loop'" in str(err.value) and err.value.param == f"tools[{len(tools) - 1}].function.parameters"


def _rules_format(fmt: str):
    return OutputRules(_tokenizer(fmt)).format
