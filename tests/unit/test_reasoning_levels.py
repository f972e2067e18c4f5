"""A reasoning level as each kind of chat template takes it (engine/rank0/reasoning.py, no MLX)."""

from __future__ import annotations

import logging

import pytest

from engine.rank0.reasoning import ReasoningLevels, template_source
from ipc.messages import REASONING_EFFORTS

# the lines of real templates that say what they take
HARMONY = ("{%- if reasoning_effort is defined %}Reasoning: {{ reasoning_effort }}"
           "{%- else %}Reasoning: medium{%- endif %}")
QWEN3 = "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{%- endif %}"
# DeepSeek-V3.1's: its switch is `thinking`, off unless given
DEEPSEEK_V31 = ("{% if not thinking is defined %}{% set thinking = false %}{% endif %}"
                "{% if add_generation_prompt %}{{'<｜Assistant｜>'}}{%- if not thinking %}{{'</think>'}}"
                "{%- else %}{{'<think>'}}{%- endif %}{% endif %}")
PLAIN = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


@pytest.mark.parametrize(("effort", "level"), [("minimal", "low"), ("low", "low"), ("medium", "medium"),
                                               ("high", "high"), ("xhigh", "high"), ("max", "high")])
def test_a_template_that_takes_a_level_gets_the_nearest_it_knows(effort, level):
    assert ReasoningLevels(HARMONY).options(effort, None) == {"reasoning_effort": level}
    # "none" stays the thinking switch, which such a template simply does not read
    assert ReasoningLevels(HARMONY).options("", False) == {"enable_thinking": False}


def test_a_template_with_a_thinking_switch_turns_it_on_and_minimal_off():
    levels = ReasoningLevels(QWEN3)
    assert {e: levels.options(e, None) for e in REASONING_EFFORTS} == {
        "minimal": {"enable_thinking": False}, **{e: {"enable_thinking": True} for e in REASONING_EFFORTS[1:]}}
    assert levels.options("high", False) == {"enable_thinking": False}  # an explicit switch wins
    assert levels.options("", None) == {}


def test_deepseek_v3_1_s_thinking_switch_is_set_by_its_own_name() -> None:
    levels = ReasoningLevels(DEEPSEEK_V31)
    assert levels.options("high", None) == {"thinking": True}
    assert levels.options("minimal", None) == {"thinking": False}
    assert levels.options("", False) == {"thinking": False}  # reasoning_effort "none", or enable_thinking false
    assert levels.options("low", False) == {"thinking": False}
    # rendered, the switch opens or closes the think block the prompt leaves for the answer
    import jinja2

    render = jinja2.Environment().from_string(DEEPSEEK_V31).render
    assert render(add_generation_prompt=True, **levels.options("high", None)).endswith("<think>")
    assert render(add_generation_prompt=True, **levels.options("minimal", None)).endswith("</think>")


def test_a_template_that_takes_neither_renders_as_without_a_level_and_says_so_at_debug(caplog):
    caplog.set_level(logging.DEBUG, logger="engine.rank0.reasoning")
    assert ReasoningLevels(PLAIN).options("high", None) == {}
    assert "reasoning_effort 'high' changes nothing" in caplog.text


class Tokenizer:
    def __init__(self, template):
        self.chat_template = template


def test_the_template_source_of_named_templates_is_all_of_them():
    assert template_source(Tokenizer(QWEN3)) == QWEN3
    assert "reasoning_effort" in template_source(Tokenizer({"default": PLAIN, "tool_use": HARMONY}))
    assert "reasoning_effort" in template_source(Tokenizer([{"name": "default", "template": HARMONY}]))
    assert template_source(Tokenizer(None)) == "" and template_source(object()) == ""
