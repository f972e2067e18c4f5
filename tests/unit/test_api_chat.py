"""/v1/chat/completions against a fake engine speaking the real wire protocol."""

from __future__ import annotations

import json
import re

import httpx
import pytest

import ipc
from api import create_app

pytestmark = pytest.mark.anyio

CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "Hi"}]}


def sse_payloads(lines: list[str]) -> list[str]:
    return [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]


async def test_non_streaming_shape(engine, client):
    r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}", body["id"])
    assert list(body) == ["id", "object", "created", "model", "choices", "usage", "system_fingerprint"]
    assert body["object"] == "chat.completion"
    assert body["model"] == "test-model"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello world", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    assert engine.generates[0].request_id == body["id"]


async def test_prompt_tokens_from_the_prefix_cache_are_reported_as_cached_tokens(engine, client):
    engine.cached_tokens = 5
    body = (await client.post("/v1/chat/completions", json=CHAT)).json()
    assert body["usage"]["prompt_tokens"] == 7 and body["usage"]["prompt_tokens_details"] == {"cached_tokens": 5}
    r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True,
                                                        "stream_options": {"include_usage": True}})
    payloads = sse_payloads(r.text.splitlines())
    assert json.loads(payloads[-2])["usage"]["prompt_tokens_details"] == {"cached_tokens": 5}


async def test_engine_gets_plain_messages_and_sampling_params(engine, client):
    r = await client.post(
        "/v1/chat/completions",
        json={
            "model": "default",
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
            ],
            "temperature": 0.5,
            "top_p": 0.9,
            "max_completion_tokens": 5,
            "max_tokens": 99,
            "stop": "END",
            "seed": 3,
            "logit_bias": {"42": -100},
            "top_k": -1,
            "repetition_penalty": 1.1,
            "some_client_extra": True,
        },
    )
    assert r.status_code == 200, r.text
    (msg,) = engine.generates
    assert msg.kind == "chat"
    assert msg.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "one\ntwo"}]
    assert msg.params == ipc.SamplingParams(
        max_tokens=5, temperature=0.5, top_p=0.9, top_k=0, seed=3, stop=["END"], logit_bias={42: -100.0},
        repetition_penalty=1.1,
    )


async def test_without_max_tokens_the_answer_is_not_cut_at_a_default_but_may_run_as_far_as_fits(engine, client):
    """As OpenAI's API: no limit but the context's (and here the KV budget's, which the engine fits it to)."""
    assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    assert (await client.post("/v1/completions", json={"model": "test-model", "prompt": "Hi"})).status_code == 200
    for gen in engine.generates:
        assert (gen.params.max_tokens, gen.params.max_tokens_default) == (32768, True)  # MAX_TOKENS_LIMIT
    assert (await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 9})).status_code == 200
    assert (engine.generates[-1].params.max_tokens, engine.generates[-1].params.max_tokens_default) == (9, False)


async def test_max_tokens_default_caps_requests_without_a_limit(engine, make_client):
    async with make_client(MAX_TOKENS_DEFAULT=77) as client:
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    assert engine.generates[0].params.max_tokens == 77


async def test_length_finish_reason_passes_through(engine, client):
    engine.reply_with(["a"], finish_reason="length")
    r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.json()["choices"][0]["finish_reason"] == "length"


async def test_streaming_shape(engine, client):
    async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache"
        payloads = sse_payloads([line async for line in r.aiter_lines()])
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert {c["id"] for c in chunks} == {engine.generates[0].request_id}
    assert all(c["object"] == "chat.completion.chunk" and "usage" not in c for c in chunks)
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""},
        {"content": "Hello"},
        {"content": " world"},
        {},
    ]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "stop"]


async def test_streaming_include_usage_adds_a_usage_chunk(engine, client):
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        payloads = sse_payloads([line async for line in r.aiter_lines()])
    assert payloads[-1] == "[DONE]"
    *chunks, last = [json.loads(p) for p in payloads[:-1]]
    assert all(c["usage"] is None for c in chunks)
    assert last["choices"] == []
    assert last["usage"] == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9,
                             "prompt_tokens_details": {"cached_tokens": 0}}


async def test_official_openai_client(engine, make_settings):
    openai = pytest.importorskip("openai")
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(make_settings(API_KEY="k"))))
    async with openai.AsyncOpenAI(base_url="http://test/v1", api_key="k", http_client=http, max_retries=0) as oa:
        reply = await oa.chat.completions.create(model="test-model", messages=[{"role": "user", "content": "Hi"}])
        assert reply.choices[0].message.content == "Hello world"
        assert reply.usage is not None and reply.usage.total_tokens == 9
        stream = await oa.chat.completions.create(
            model="test-model",
            messages=[{"role": "user", "content": "Hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        text = ""
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
        assert text == "Hello world"
        assert chunk.usage is not None and chunk.usage.completion_tokens == 2
