"""/v1/completions against a fake engine speaking the real wire protocol."""

from __future__ import annotations

import json
import re

import pytest

pytestmark = pytest.mark.anyio


async def test_non_streaming_shape(engine, client):
    r = await client.post("/v1/completions", json={"model": "test-model", "prompt": "Once", "max_tokens": 4})
    assert r.status_code == 200
    body = r.json()
    assert re.fullmatch(r"cmpl-[0-9a-f]{32}", body["id"])
    assert body["object"] == "text_completion"
    assert body["choices"] == [{"text": "Hello world", "index": 0, "logprobs": None, "finish_reason": "stop"}]
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    (msg,) = engine.generates
    assert (msg.kind, msg.prompt, msg.params.max_tokens, msg.request_id) == ("completion", "Once", 4, body["id"])


@pytest.mark.parametrize(("prompt", "sent"), [([1, 2, 3], [1, 2, 3]), (["just one"], "just one")])
async def test_prompt_forms(engine, client, prompt, sent):
    r = await client.post("/v1/completions", json={"model": "test-model", "prompt": prompt})
    assert r.status_code == 200, r.text
    assert engine.generates[0].prompt == sent


@pytest.mark.parametrize("prompt", [["a", "b"], [[1, 2], [3]], [], "", [1, "a"], [-1]])
async def test_bad_or_batch_prompts_are_refused(engine, client, prompt):
    r = await client.post("/v1/completions", json={"model": "test-model", "prompt": prompt})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "prompt"
    assert engine.generates == []


async def test_streaming_shape(engine, client):
    body = {"model": "test-model", "prompt": "Once", "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        payloads = [line.removeprefix("data: ") async for line in r.aiter_lines() if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert [c["choices"][0]["text"] for c in chunks[:-1]] == ["Hello", " world", ""]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None, None, "stop"]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["total_tokens"] == 9


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"suffix": "end"}, "suffix"), ({"best_of": 3}, "best_of"), ({"echo": True, "logprobs": 1, "n": 2}, "n")],
)
async def test_unsupported_parameters_are_refused(engine, client, extra, param):
    r = await client.post("/v1/completions", json={"model": "test-model", "prompt": "x", **extra})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param
    assert r.json()["error"]["code"] == "unsupported_parameter"


@pytest.mark.parametrize("extra", [{"echo": False}, {"suffix": None}, {"best_of": 1}, {"n": 1}, {"logprobs": None}])
async def test_default_values_of_unsupported_parameters_are_fine(engine, client, extra):
    r = await client.post("/v1/completions", json={"model": "test-model", "prompt": "x", **extra})
    assert r.status_code == 200, r.text
