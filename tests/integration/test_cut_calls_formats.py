"""A tool call cut by max_tokens, read in every tool-call format: one real call per format, cut at every position.

Before the function's name is whole there is no call; once the first argument starts the name is read, and
the arguments so far are always a prefix of the JSON object the whole call's arguments serialise to (so never
markup). Every format module under engine/toolformats must have its call here, so a format added without a
reader of cut calls fails. In tests/integration because the formats reuse mlx-lm's parsers, which import MLX.
"""

from __future__ import annotations

import json
import pkgutil

import pytest

from engine import toolformats
from engine.rank0.cut_call import cut_call
from engine.rank0.output import OutputRules, TextSplitter
from engine.toolformats import format_named
from engine.zoo.names import FORMAT_MODELS, TOOL_FORMATS
from engine.zoo.tool_models import TOOL_CALLING_MODELS, load_tool_model_tokenizer
from tests.harness import MODEL_CACHE

NAME = "get_weather"
# A raw-text value with a quote and a comma, then JSON values; the last one is not a string, so it ends the
# same way in every format.
ARGS = {"city": 'Paris, "Île"', "days": 3, "metric": True, "hours": [9, 12]}
FLAT = {k: v for k, v in ARGS.items() if k != "hours"}  # FunctionGemma holds no arrays
PROPS = {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
         "hours": {"type": "array", "items": {"type": "integer"}}}
TOOLS = [{"type": "function", "function": {"name": NAME, "parameters": {"type": "object", "properties": PROPS}}}]


def _value(v):
    return v if isinstance(v, str) else json.dumps(v)


def _xml(args, item: str) -> str:
    return "".join(item.format(k=k, v=_value(v)) for k, v in args.items())


def _listed(args, assign: str, sep: str, quote: str) -> str:
    """`k=v, ...` (pythonic) or `k:v,...` (Gemma): a string between quote markers when the format has them."""
    return sep.join(f"{k}{assign}{quote}{v}{quote}" if isinstance(v, str) and quote
                    else f"{k}{assign}{json.dumps(v, ensure_ascii=False)}" for k, v in args.items())


GEMMA_QUOTE = '<|"|>'
J = json.dumps(ARGS, ensure_ascii=False)
GLM = _xml(ARGS, "<arg_key>{k}</arg_key><arg_value>{v}</arg_value>")
# The text after each format's start marker, as the text splitter hands a cut call to its reader.
CALLS = {
    "json_tools": f'\n{{"name": "{NAME}", "arguments": {J}}}\n',
    "qwen3_coder": f"\n<function={NAME}>\n" + _xml(ARGS, "<parameter={k}>\n{v}\n</parameter>\n") + "</function>\n",
    "glm47": f"{NAME}{GLM}",
    "laguna": f"{NAME}{GLM}",
    "longcat": NAME + GLM.replace("arg_", "longcat_arg_"),
    "minimax_m2": f'\n<invoke name="{NAME}">\n' + _xml(ARGS, '<parameter name="{k}">{v}</parameter>\n') + "</invoke>\n",
    "minicpm5": f'"{NAME}">' + _xml(ARGS, '<param name="{k}">{v}</param>'),
    "muse_spark": f'<atem:invoke name="{NAME}">' + "".join(
        f'<atem:parameter name="{k}">{json.dumps(v, ensure_ascii=False)}</atem:parameter>' for k, v in ARGS.items())
        + "</atem:invoke>",
    "kimi_k2": f"<|tool_call_begin|>functions.{NAME}:0<|tool_call_argument_begin|>{J}<|tool_call_end|>",
    "kimi_k3": f'<|open|>call tool="{NAME}" index="1"<|sep|><|open|>json type="object"<|sep|>{J}'
               "<|close|>json<|sep|><|close|>call<|sep|>",
    "mistral": f"{NAME}[ARGS]{J}",
    "pythonic": f"[{NAME}({_listed(ARGS, '=', ', ', '')})]",
    "gemma4": f"call:{NAME}{{{_listed(ARGS, ':', ',', GEMMA_QUOTE)}}}",
    "function_gemma": f"call:{NAME}{{{_listed(FLAT, ':', ',', '<escape>')}}}",
    "harmony": f"{NAME} <|constrain|>json<|message|>{J}",
    "deepseek": f"<｜tool▁call▁begin｜>{NAME}<｜tool▁sep｜>{J}<｜tool▁call▁end｜>",
    "deepseek_v3": f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{NAME}\n```json\n{J}\n```<｜tool▁call▁end｜>",
    "dsml": f'\n<｜DSML｜invoke name="{NAME}">\n' + "".join(
        f'<｜DSML｜parameter name="{k}" string="{str(isinstance(v, str)).lower()}">{_value(v)}</｜DSML｜parameter>\n'
        for k, v in ARGS.items()) + "</｜DSML｜invoke>",
}
CALLS["dsml_v4"] = CALLS["dsml"]
# a call written after a whole one in the same section: the reader reports the one that was cut
SECTIONS = {"minimax_m2", "muse_spark", "kimi_k2", "kimi_k3", "deepseek", "deepseek_v3", "dsml", "dsml_v4"}


def _formats() -> list[str]:
    names = [m.name for m in pkgutil.iter_modules(toolformats.__path__) if not m.ispkg]
    return sorted(n for n in names if format_named(n) is not None)


def test_every_format_has_a_call_here():
    formats = _formats()
    assert {*TOOL_FORMATS, "json_tools", "harmony", "deepseek", "dsml"} <= set(formats), formats
    assert set(formats) <= set(CALLS), set(formats) - set(CALLS)
    assert FORMAT_MODELS  # the zoo's own-format models write harmony, deepseek and dsml, listed above


@pytest.mark.parametrize("fmt", _formats())
def test_a_call_cut_anywhere_gives_its_name_and_a_prefix_of_its_arguments(fmt):
    text, args = CALLS[fmt], FLAT if fmt == "function_gemma" else ARGS
    whole = json.dumps(args, ensure_ascii=False)
    named = text.index(NAME) + len(NAME)
    first_key = text.index(next(iter(args)), named)
    last = json.dumps(list(args.values())[-1])
    written = text.rindex(last) + len(last)  # the last value written whole, its end not yet
    for cut in range(len(text)):
        call = cut_call(format_named(fmt), text[:cut], TOOLS)
        if cut < named:
            assert call is None, (text[:cut], call)
            continue
        if call is None:
            assert cut < first_key or cut > written, text[:cut]
            continue
        assert call.partial and call.name == NAME, (text[:cut], call)
        assert whole.startswith(call.arguments), (text[:cut], call.arguments)
        if cut == written:
            assert call.arguments == whole[:-1], (text[:cut], call.arguments)


@pytest.mark.parametrize("fmt", sorted(SECTIONS))
def test_the_call_cut_is_the_last_one_of_its_section(fmt):
    text = CALLS[fmt].replace(NAME, "first") + "\n" + CALLS[fmt]
    call = cut_call(format_named(fmt), text[:text.rindex("[9, 12]") + 4], TOOLS)
    assert call is not None and call.name == NAME and call.arguments.rstrip().endswith('"hours": [9,')
    assert json.dumps(ARGS, ensure_ascii=False).startswith(call.arguments)


@pytest.mark.parametrize("model", TOOL_CALLING_MODELS)
def test_the_splitter_reports_the_cut_call_of_every_zoo_model(model):
    """Through the text splitter as the engine runs it, on the zoo model's own tokenizer: the declared tools
    reach the reader, so an integer written so far comes back a number."""
    fmt, tokenizer = load_tool_model_tokenizer(model, MODEL_CACHE)
    rules = OutputRules(tokenizer)
    text, args = CALLS[fmt], FLAT if fmt == "function_gemma" else ARGS
    last = json.dumps(list(args.values())[-1])
    header = "<|channel|>commentary " if fmt == "harmony" else ""  # its calls start inside a message header
    # in a section of calls, a whole call first: it stays whole
    before = text.replace(NAME, "first") + "\n" if fmt in SECTIONS else ""
    cut = header + rules.format.start + before + text[:text.rindex(last) + len(last)]
    splitter = TextSplitter(rules, rules.machine(chat=True, tools=True, stop=[]), rules.initial_state([], True),
                            [*TOOLS, {"type": "function", "function": {**TOOLS[0]["function"], "name": "first"}}],
                            True)
    piece, _ = splitter.feed(cut)
    piece.add(splitter.finish("length"))
    assert piece.content == "" and len(piece.tool_calls) == 1 + bool(before), (cut, piece)
    *whole, call = piece.tool_calls
    assert [(c.name, c.partial, json.loads(c.arguments)) for c in whole] == ([("first", False, args)] if before else [])
    assert call.partial and call.name == NAME
    assert json.loads(call.arguments + "}") == args, (cut, call.arguments)
