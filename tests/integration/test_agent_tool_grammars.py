"""The tools Claude Code and Codex CLI send (bench/data/agent_tools.json) become a forced-call grammar in every
tool-call format, or are refused as a client would be told: a 400 naming the function and why. Not timed:
bench/tool_grammars.py measures how long each compile takes.
In tests/integration because the formats reuse mlx-lm's parsers, which import MLX.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from bench.tool_grammars import agent_tools, choices
from engine.decoding.constrained import GrammarError, Grammars
from engine.rank0.output import OutputRules
from engine.zoo.tool_models import TOOL_CALLING_MODELS, load_tool_model_tokenizer
from tests.harness import MODEL_CACHE

AGENTS = agent_tools()
# Formats that cannot hold every kind of argument, and what their refusal says.
LIMITED = {"function_gemma": "which holds strings, numbers, booleans and null only"}


@cache
def _zoo(model: str) -> tuple[str, Grammars, Any]:
    name, tokenizer = load_tool_model_tokenizer(model, MODEL_CACHE)
    return name, Grammars(tokenizer), OutputRules(tokenizer).format


@pytest.mark.parametrize("agent", sorted(AGENTS))
@pytest.mark.parametrize("model", TOOL_CALLING_MODELS)
def test_an_agents_tools_compile_in_every_format_or_are_refused_by_name(model: str, agent: str) -> None:
    name, grammars, fmt = _zoo(model)
    tools = AGENTS[agent]
    assert fmt is not None and fmt.forceable, name
    for label, choice, parallel in choices(tools):
        try:
            grammar = grammars.tool_grammar(fmt, tools, choice, parallel)
        except GrammarError as err:
            # what the client reads: the request field, the function and the reason
            assert err.param is not None and err.param.startswith("tools["), err
            index = int(err.param[len("tools["):].split("]", 1)[0])
            assert f"(function {tools[index]['function']['name']!r})" in str(err), err
            assert name in LIMITED and LIMITED[name] in str(err), err
            continue
        assert grammar, (name, label)
