"""The official openai client against the real engine and API on the demo model."""

from __future__ import annotations

import httpx
import openai
import pytest

MESSAGES = [{"role": "user", "content": "hello"}]


def test_chat_completion_serves_tokens_with_usage(client):
    r = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=16, temperature=0)
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens > 0
    assert r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_greedy_is_repeatable(client):
    a = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=24, temperature=0)
    b = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=24, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_max_tokens_bounds_length(client):
    r = client.chat.completions.create(
        model="default", messages=MESSAGES, max_tokens=5, temperature=0,
        logit_bias={}, seed=1,
    )
    assert r.usage.completion_tokens <= 5
    if r.usage.completion_tokens == 5:
        assert r.choices[0].finish_reason == "length"


def test_streaming_reassembles_to_the_non_streamed_text(client):
    full = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=24, temperature=0)
    stream = client.chat.completions.create(
        model="default", messages=MESSAGES, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_seeded_sampling_is_repeatable(client):
    kw = dict(model="default", messages=MESSAGES, max_tokens=24, temperature=1.0, seed=1234)
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_completions_non_streaming_and_streaming(client):
    r = client.completions.create(model="default", prompt="The weather in Paris", max_tokens=12, temperature=0)
    assert r.object == "text_completion"
    assert r.usage.completion_tokens > 0
    s = client.completions.create(model="default", prompt="The weather in Paris", max_tokens=12, temperature=0,
                                  stream=True)
    assert "".join(c.choices[0].text for c in s if c.choices) == r.choices[0].text


def test_stop_string_is_never_emitted(client):
    # The end tokens are banned, so the text runs to max_tokens and always has a stop string to pick.
    no_end = {"0": -100, "2": -100}
    base = client.completions.create(model="default", prompt="hello", max_tokens=24, temperature=0,
                                     logit_bias=no_end)
    text = base.choices[0].text
    assert len(text) >= 6, text
    stop = text[3:6]
    r = client.completions.create(model="default", prompt="hello", max_tokens=24, temperature=0, stop=[stop],
                                  logit_bias=no_end)
    assert stop not in r.choices[0].text
    assert r.choices[0].text == text[: text.find(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["demo-tiny"]
    assert models.data[0].owned_by


def test_invalid_parameter_is_a_400_naming_it(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="default", messages=MESSAGES, temperature=7)
    assert err.value.status_code == 400
    assert err.value.body["param"] == "temperature"


def test_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=4)


def test_over_long_prompt_is_context_length_exceeded(client, stack):
    info = stack.probe()
    prompt = list(range(5, 6)) * (info["context_length"] + 10)
    with pytest.raises(openai.BadRequestError) as err:
        # a scoring request (echo, logprobs, max_tokens 0), as evaluation tools send: refused like any other
        client.completions.create(model="default", prompt=prompt, echo=True, logprobs=5, max_tokens=0)
    assert err.value.code == "context_length_exceeded"
    # and the engine keeps serving
    r = client.completions.create(model="default", prompt="hi", max_tokens=2)
    assert r.usage.completion_tokens > 0


def test_health_is_ok(stack):
    r = httpx.get(stack.base_url + "/health", timeout=5)
    assert r.status_code == 200
    assert r.json()["status"] == "ok"
