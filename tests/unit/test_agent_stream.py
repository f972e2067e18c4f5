"""How bench/agent_replay.py reads a chat stream: the first token is the first output, never the role chunk."""

from __future__ import annotations

import json

from bench.agent_replay import Client, Reply


def events(*chunks: dict) -> Reply:
    r = Reply(sent=0.0)
    for c in chunks:
        assert not Client._event(r, json.dumps(c))
    assert Client._event(r, "[DONE]")
    return r


def chunk(delta: dict, finish: str | None = None) -> dict:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


USAGE = {"choices": [], "usage": {"prompt_tokens": 3000, "completion_tokens": 2,
                                  "prompt_tokens_details": {"cached_tokens": 2900}}}


def test_the_role_chunk_is_not_the_first_token_and_usage_gives_the_cached_tokens():
    r = events(chunk({"role": "assistant", "content": ""}), chunk({"content": "Hel"}), chunk({"content": "lo"}),
               chunk({}, "length"), USAGE)
    assert r.first_from == "output" and r.content == "Hello" and r.finish_reason == "length"
    assert (r.prompt_tokens, r.cached_tokens, r.completion_tokens) == (3000, 2900, 2)


def test_an_answer_without_visible_text_takes_its_first_token_at_the_finish():
    r = events(chunk({"role": "assistant", "content": ""}), chunk({}, "stop"), USAGE)
    assert r.first is not None and r.first_from == "finish" and r.content == ""


def test_tool_calls_are_output_and_compare_without_their_random_ids():
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    a = events(chunk({"role": "assistant", "content": ""}), chunk({"tool_calls": [call]}), chunk({}, "tool_calls"))
    b = events(chunk({"tool_calls": [{**call, "id": "call_2"}]}), chunk({}, "tool_calls"))
    assert a.first_from == "output" and a.message()["tool_calls"][0]["function"]["name"] == "read_file"
    assert a.output() == b.output()
