"""DeepSeek's and GLM's thinking markers on their zoo models: the think block goes to reasoning in every dialect
(reasoning_content, Anthropic thinking blocks, Responses reasoning items), and reasoning_effort reaches the
template's switch (DeepSeek V3.1 and V3.2 open or close the think block in the prompt, GLM writes an empty one).

Random weights never write <think> unforced, so the splitter is fed the families' hand-written output; served,
a prompt that leaves the think block open makes all the random text reasoning.
"""

from __future__ import annotations

from functools import cache

import anthropic
import httpx
import pytest
from mlx_lm.tokenizer_utils import load

from engine.rank0.output import OutputRules, TextSplitter
from engine.rank0.piece import Piece
from engine.zoo import ensure_zoo_model
from tests.harness import MODEL_CACHE, Stack, assert_engine_logs_clean

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
GLM_CALL = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value></tool_call>"
DS_CALL = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Rome\"}<｜tool▁call▁end｜>"
           "<｜tool▁calls▁end｜>")


@cache
def tokenizer(name: str):
    return load(ensure_zoo_model(name, MODEL_CACHE))


def route(name: str, prompt: str, text: str, step: int) -> Piece:
    tok = tokenizer(name)
    rules = OutputRules(tok)
    splitter = TextSplitter(rules, rules.machine(chat=True, tools=True, stop=[]),
                            rules.initial_state(tok.encode(prompt, add_special_tokens=False), True), TOOLS, True)
    out = Piece()
    for i in range(0, len(text), step):
        piece, ended = splitter.feed(text[i:i + step])
        out.add(piece)
        if ended:
            return out
    out.add(splitter.finish())
    return out


@pytest.mark.parametrize(("name", "prompt", "text", "routed"), [
    # GLM-4.5's template leaves the turn open, the model opens <think>; GLM-4.7's opens it in the prompt
    ("tools-glm47", "<|im_start|>assistant\n", f"<think>Need weather.</think>Let me check.{GLM_CALL}",
     ("Need weather.", "Let me check.", 1)),
    ("tools-glm47", "<|im_start|>assistant\n<think>", f"Need weather.</think>Let me check.{GLM_CALL}",
     ("Need weather.", "Let me check.", 1)),
    ("tools-glm47", "<|im_start|>assistant\n<think></think>", "Sunny.", ("", "Sunny.", 0)),
    ("tools-glm47", "<|im_start|>assistant\n", "<think>Easy.</think>\n\nSunny.", ("Easy.", "Sunny.", 0)),
    # DeepSeek V3.1 in thinking mode (the prompt opens <think>) and not (it closes it)
    ("deepseek-v3.1-tools", "<｜User｜>Hi<｜Assistant｜><think>", f"Need weather.</think>Let me check.{DS_CALL}",
     ("Need weather.", "Let me check.", 1)),
    ("deepseek-v3.1-tools", "<｜User｜>Hi<｜Assistant｜><think>", "Easy.</think>\n\nSunny.", ("Easy.", "Sunny.", 0)),
    ("deepseek-v3.1-tools", "<｜User｜>Hi<｜Assistant｜></think>", "Sunny.", ("", "Sunny.", 0)),
])
def test_the_think_block_is_reasoning_split_anywhere(name, prompt, text, routed) -> None:
    for step in (1, 2, 5, len(text)):
        out = route(name, prompt, text, step)
        assert (out.reasoning, out.content, len(out.tool_calls)) == routed, step
        assert all(c.name == "get_weather" for c in out.tool_calls)


@pytest.fixture(scope="module", params=["deepseek-v3.1-tools", "deepseek-v3.2-tools", "tools-glm47"])
def served(request):
    stack = Stack(extra={"MODEL": "zoo-" + request.param})
    engine = stack.start_engine()
    api = stack.start_api()
    yield request.param, stack
    api.stop()
    engine.stop()
    assert_engine_logs_clean(stack)


def chat(stack: Stack, **kw) -> dict:
    r = httpx.post(stack.base_url + "/v1/chat/completions", timeout=60, json={
        "model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "seed": 3, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def test_reasoning_effort_reaches_the_switch_and_the_think_block_is_reasoning(served) -> None:
    name, stack = served
    on, off = chat(stack, reasoning_effort="high"), chat(stack, reasoning_effort="minimal")
    if name == "tools-glm47":  # thinking off writes an empty think block into the prompt
        assert off["usage"]["prompt_tokens"] > on["usage"]["prompt_tokens"]
        return
    # DeepSeek V3.1 and V3.2: "high" leaves <think> open, so all the text is reasoning; "minimal" closes it
    assert on["choices"][0]["message"].get("reasoning_content") and not on["choices"][0]["message"]["content"]
    assert off["choices"][0]["message"]["content"] and not off["choices"][0]["message"].get("reasoning_content")
    with anthropic.Anthropic(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60) as claude:
        kw = dict(model="default", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
        thought = claude.messages.create(thinking={"type": "enabled", "budget_tokens": 1024}, **kw)
        assert [b.type for b in thought.content] == ["thinking"] and thought.content[0].thinking
        plain = claude.messages.create(thinking={"type": "disabled"}, **kw)
        assert [b.type for b in plain.content] == ["text"]
    r = httpx.post(stack.base_url + "/v1/responses", timeout=60, json={
        "model": "default", "input": "Hi", "max_output_tokens": 8, "reasoning": {"effort": "high"}})
    assert r.status_code == 200 and [item["type"] for item in r.json()["output"]] == ["reasoning"]
