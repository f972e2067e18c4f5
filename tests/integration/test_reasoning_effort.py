"""Reasoning levels on the real engine: accepted in every dialect, and rendered as the chat template takes them.

The demo template has Qwen3's thinking switch: a level turns thinking on ("minimal" off), as the prompt shows.
"""

from __future__ import annotations

import anthropic
import httpx
import pytest
from mlx_lm.utils import load_tokenizer

from engine.rank0 import validate
from engine.rank0.admission import Prompter
from ipc import Generate, SamplingParams

MESSAGES = [{"role": "user", "content": "hello"}]


def prompt_tokens(client, **kw) -> int:
    r = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=1, **kw)
    return r.usage.prompt_tokens


def test_every_reasoning_effort_is_accepted_and_switches_thinking_as_the_template_takes_it(client):
    default, off = prompt_tokens(client), prompt_tokens(client, reasoning_effort="none")
    assert off != default  # the demo template writes an empty think block when thinking is off
    # cline --thinking low sends reasoning_effort "low": thinking on, the template's default here
    for level in ("low", "medium", "high", "xhigh", "max"):
        assert prompt_tokens(client, reasoning_effort=level) == default
    assert prompt_tokens(client, reasoning_effort="minimal") == off


def test_reasoning_levels_of_the_other_dialects_reach_the_template(stack, client):
    default, off = prompt_tokens(client), prompt_tokens(client, reasoning_effort="none")
    r = httpx.post(stack.base_url + "/v1/responses", timeout=60, json={
        "model": "default", "input": "hello", "max_output_tokens": 16, "reasoning": {"effort": "minimal"}})
    assert r.status_code == 200 and r.json()["usage"]["input_tokens"] == off
    with anthropic.Anthropic(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60) as claude:
        m = claude.messages.create(model="default", max_tokens=1, messages=MESSAGES, output_config={"effort": "high"})
        assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == default
    r = httpx.post(stack.base_url + "/api/chat", timeout=60, json={
        "model": "default", "messages": MESSAGES, "think": "low", "stream": False, "options": {"num_predict": 1}})
    assert r.status_code == 200 and r.json()["prompt_eval_count"] == default


# gpt-oss's harmony template reads reasoning_effort (its system message says "Reasoning: <level>")
HARMONY = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
           "<|im_start|>system\nReasoning: {{ reasoning_effort | default('medium') }}<|im_end|>\n"
           "<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def harmony_prompter(demo_tiny):
    tok = load_tokenizer(demo_tiny)
    tok._tokenizer.chat_template = HARMONY
    limits = validate.Limits(vocab_size=1024, logits_size=1024, context_length=131072, max_batch=4, max_queue=4)
    return Prompter(tok, limits, grammars=None)  # type: ignore[arg-type]  # no grammar is compiled here


@pytest.mark.parametrize(("effort", "line"), [("", "Reasoning: medium"), ("low", "Reasoning: low"),
                                              ("minimal", "Reasoning: low"), ("high", "Reasoning: high"),
                                              ("max", "Reasoning: high")])
def test_a_template_that_takes_reasoning_effort_gets_the_level(harmony_prompter, effort, line):
    gen = Generate(request_id="r", kind="chat", params=SamplingParams(max_tokens=1), messages=MESSAGES,
                   reasoning_effort=effort)
    text = harmony_prompter.tokenizer.decode(harmony_prompter.tokens(gen))
    assert line in text
