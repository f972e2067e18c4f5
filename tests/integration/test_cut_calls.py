"""A forced tool call cut by max_tokens, on the real engine, through the official clients of every dialect
that can force one: the client learns the function, the arguments written so far, and that it was cut.

Greedy decoding, so a call cut after n tokens is the first n tokens of the uncut one: its arguments are a
prefix of the whole call's. (Ollama's API cannot force a call: tests/unit/test_api_cut_calls.py covers it.)
"""

from __future__ import annotations

import json

import anthropic
import pytest

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
# max_tokens that end inside the arguments: the name is whole by the 12th token of the demo tokenizer
CUTS = [14, 16, 18, 20, 22]


def chat(client, **kw):
    return client.chat.completions.create(**{"model": "default", "messages": MESSAGES, "tools": TOOLS,
                                             "temperature": 0, **kw})


@pytest.fixture(scope="module")
def whole(client) -> str:
    """The arguments of the uncut greedy call."""
    (call,) = chat(client, tool_choice="required", max_tokens=80).choices[0].message.tool_calls
    return call.function.arguments


def cut_arguments(client, max_tokens: int) -> str:
    (call,) = chat(client, tool_choice="required", max_tokens=max_tokens).choices[0].message.tool_calls
    return call.function.arguments


@pytest.mark.parametrize("tool_choice", ["required", NAMED])
def test_chat_says_length_and_gives_the_call_with_its_arguments_so_far(client, whole, tool_choice):
    for n in CUTS:
        choice = chat(client, tool_choice=tool_choice, max_tokens=n).choices[0]
        assert choice.finish_reason == "length" and not choice.message.content
        (call,) = choice.message.tool_calls
        assert call.id.startswith("call_") and call.function.name == "get_weather"
        written = call.function.arguments
        assert written and whole.startswith(written) and written != whole

        calls: dict[int, dict] = {}
        content, finish = "", None
        for chunk in chat(client, tool_choice=tool_choice, max_tokens=n, stream=True):
            delta = chunk.choices[0].delta
            content += delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
            for d in delta.tool_calls or []:
                c = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                c["id"] += d.id or ""
                c["name"] += d.function.name or ""
                c["arguments"] += d.function.arguments or ""
        assert (content, finish) == ("", "length")
        assert [(c["name"], c["arguments"]) for c in calls.values()] == [("get_weather", call.function.arguments)]
        assert calls[0]["id"].startswith("call_")


def test_a_call_cut_before_its_name_is_whole_is_no_call_but_still_length(client):
    choice = chat(client, tool_choice="required", max_tokens=4).choices[0]
    assert (choice.finish_reason, choice.message.tool_calls, choice.message.content or "") == ("length", None, "")


@pytest.fixture(scope="module")
def claude(stack):
    with anthropic.Anthropic(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


@pytest.mark.parametrize("tool_choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_anthropic_says_max_tokens_with_the_partial_tool_use_block(client, claude, whole, tool_choice):
    complete = json.loads(whole)
    kw = dict(model="default", messages=MESSAGES, tool_choice=tool_choice, extra_body={"temperature": 0},
              tools=[{"name": "get_weather", "input_schema": WEATHER}])
    inputs = []
    for n in CUTS:
        m = claude.messages.create(max_tokens=n, **kw)
        assert m.stop_reason == "max_tokens"
        (block,) = m.content
        assert (block.type, block.name) == ("tool_use", "get_weather") and block.id.startswith("toolu_")
        # the values written whole so far, each as the uncut call has it
        assert all(complete[k] == v for k, v in block.input.items()), (block.input, whole)
        inputs.append(block.input)

        with claude.messages.stream(max_tokens=n, **kw) as stream:
            written = "".join(ev.delta.partial_json for ev in stream
                              if ev.type == "content_block_delta" and ev.delta.type == "input_json_delta")
            final = stream.get_final_message()
        assert written == cut_arguments(client, n)  # the JSON text so far, as chat gives it
        assert final.stop_reason == "max_tokens"
        assert [(b.type, b.name, b.input) for b in final.content] == [("tool_use", "get_weather", block.input)]
    assert any(inputs), "no cut was late enough to hold a whole value"


def test_responses_is_incomplete_with_the_function_call_so_far(client, whole):
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    kw = dict(model="default", input=MESSAGES[0]["content"], tools=tools, tool_choice="required", temperature=0)
    for n in CUTS:
        r = client.responses.create(max_output_tokens=n, **kw)
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
        (item,) = r.output
        assert (item.type, item.name, item.status) == ("function_call", "get_weather", "incomplete")
        assert item.arguments == cut_arguments(client, n) and whole.startswith(item.arguments)

        events = list(client.responses.create(max_output_tokens=n, stream=True, **kw))
        deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        assert deltas == item.arguments
        assert events[-1].type == "response.incomplete"
        assert [(o.name, o.arguments, o.status) for o in events[-1].response.output] == [
            ("get_weather", item.arguments, "incomplete")]
