"""Tools for a chat template without tool syntax, without MLX: the template is asked whether it writes tools, and
where it does not, the tools, earlier calls and tool results reach the model through the messages."""

from __future__ import annotations

import json

import jinja2

from engine.rank0.tool_prompt import renders_tools, with_tools_described
from tests.harness import REPO
from tests.plain_chatml import CHATML

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}}


def renderer(source: str):
    template = jinja2.Environment().from_string(source)
    return lambda messages, tools: template.render(messages=messages, tools=tools, add_generation_prompt=True)


def test_a_template_is_asked_whether_it_writes_tools():
    assert not renders_tools(renderer(CHATML))
    assert renders_tools(renderer((REPO / "engine" / "modelgen" / "chat_template.jinja").read_text()))


def test_tools_calls_and_results_reach_a_template_without_tool_syntax():
    history = [{"role": "system", "content": "Be brief."},
               {"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": {"location": "Paris"}}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    text = renderer(CHATML)(with_tools_described(history, [TOOL]), None)
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nBe brief.\n\n# Tools") and json.dumps(TOOL) in system
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' in system
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n'
            '</tool_call><|im_end|>') in text
    assert "<|im_start|>user\n<tool_response>\n18 C, sunny\n</tool_response><|im_end|>" in text
    # without a system message one is added; without tools only the history is rewritten
    assert with_tools_described([{"role": "user", "content": "hi"}], [TOOL])[0]["role"] == "system"
    assert with_tools_described(history[1:], None)[0] == history[1]
