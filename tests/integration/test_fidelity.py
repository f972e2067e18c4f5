"""OpenAI fidelity with the official client on the real engine: sampling, stops, logprobs, n, streams, strictness."""

from __future__ import annotations

import math

import openai
import pytest
from tokenizers import Tokenizer

from tests.harness import MODEL_CACHE

MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def vocab(stack):
    """Token ids of the demo model (the engine has generated it by now)."""
    (folder,) = sorted(MODEL_CACHE.glob("demo-tiny-*"))[-1:]
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def chat(client, **kw):
    return client.chat.completions.create(**{"model": "default", "messages": MESSAGES, "max_tokens": 16, **kw})


# ---------------------------------------------------------------- sampling


def test_same_seed_same_output_other_seed_other_output(client):
    kw = dict(temperature=1.0, top_p=0.95, max_tokens=24, extra_body={"top_k": 50, "min_p": 0.01})
    a, b, c = chat(client, seed=11, **kw), chat(client, seed=11, **kw), chat(client, seed=12, **kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.choices[0].message.content != c.choices[0].message.content
    p = dict(model="default", prompt="The weather in Paris", max_tokens=16, temperature=0.8, seed=5)
    assert client.completions.create(**p).choices[0].text == client.completions.create(**p).choices[0].text


def test_penalties_and_user_are_honoured_not_refused(client):
    plain = chat(client, temperature=0, max_tokens=32).choices[0].message.content
    penalised = chat(client, temperature=0, max_tokens=32, presence_penalty=2, frequency_penalty=2, user="u-1",
                     extra_body={"repetition_penalty": 1.5}).choices[0].message.content
    assert penalised != plain


def test_logit_bias_steers_the_sampled_tokens(client, vocab):
    (the,) = vocab.encode(" the", add_special_tokens=False).ids
    r = client.completions.create(model="default", prompt="hello", max_tokens=6, temperature=0,
                                  logit_bias={str(the): 100})
    assert r.choices[0].text == " the" * 6
    first = client.completions.create(model="default", prompt="hello", max_tokens=1, temperature=0, logprobs=0)
    banned = vocab.token_to_id(vocab.id_to_token(vocab.encode(first.choices[0].text).ids[0]))
    other = client.completions.create(model="default", prompt="hello", max_tokens=1, temperature=0,
                                      logit_bias={str(banned): -100})
    assert other.choices[0].text != first.choices[0].text


def test_max_completion_tokens_wins_over_max_tokens(client):
    r = chat(client, temperature=0, max_tokens=40, max_completion_tokens=3, logit_bias={})
    assert r.usage.completion_tokens <= 3


# ---------------------------------------------------------------- stop strings


def test_a_stop_string_spanning_two_tokens_is_matched_and_never_emitted(client):
    kw = dict(model="default", prompt="The weather in Paris", max_tokens=24, temperature=0)
    full = client.completions.create(**kw, logprobs=0).choices[0]
    tokens, text = full.logprobs.tokens, full.text
    assert "".join(tokens) == text
    # the end of one token and the start of the next, so no single token holds it
    i = next(i for i in range(1, len(tokens) - 1) if len(tokens[i]) >= 2 and len(tokens[i + 1]) >= 2
             and text.find(tokens[i][-2:] + tokens[i + 1][:2]) == full.logprobs.text_offset[i] + len(tokens[i]) - 2)
    stop = tokens[i][-2:] + tokens[i + 1][:2]
    cut = text[: text.find(stop)]
    r = client.completions.create(**kw, stop=[stop, "never-seen"])
    assert (r.choices[0].text, r.choices[0].finish_reason) == (cut, "stop")
    chunks = [c.choices[0].text for c in client.completions.create(**kw, stop=stop, stream=True) if c.choices]
    assert "".join(chunks) == cut and not any(stop in c for c in chunks)


# ---------------------------------------------------------------- logprobs


def check_entry(entry, k: int) -> None:
    assert isinstance(entry.token, str) and entry.logprob <= 0
    assert isinstance(entry.bytes, list) and all(0 <= b < 256 for b in entry.bytes)
    assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token
    assert len(entry.top_logprobs) == k
    values = [t.logprob for t in entry.top_logprobs]
    assert values == sorted(values, reverse=True)
    for t in entry.top_logprobs:
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token


def test_chat_logprobs_have_openais_shape(client):
    r = chat(client, temperature=0, max_tokens=8, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        check_entry(entry, 3)
        # greedy: the sampled token is the most likely one
        assert math.isclose(entry.logprob, entry.top_logprobs[0].logprob, abs_tol=1e-5)
        assert entry.token == entry.top_logprobs[0].token
    # (chat text drops the first token's leading space, as mlx-lm's detokeniser does)
    assert "".join(e.token for e in content).lstrip(" ") == r.choices[0].message.content
    assert chat(client, max_tokens=2).choices[0].logprobs is None
    # logprobs without alternatives, and the same entries when streamed
    plain = chat(client, temperature=0, max_tokens=8, logprobs=True).choices[0].logprobs.content
    assert [e.top_logprobs for e in plain] == [[]] * len(plain)
    streamed = [e for c in chat(client, temperature=0, max_tokens=8, logprobs=True, top_logprobs=3, stream=True)
                if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [(e.token, round(e.logprob, 4)) for e in content]


def test_completion_logprobs_have_the_legacy_shape(client):
    r = client.completions.create(model="default", prompt="hello", max_tokens=6, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert value <= 0 and 1 <= len(top) <= 2 and math.isclose(max(top.values()), value, abs_tol=1e-5)


# ---------------------------------------------------------------- n, streams


def test_n_choices_are_extra_sequences_and_choice_0_is_the_n1_answer(client):
    kw = dict(temperature=1.0, seed=21, max_tokens=12)
    one = chat(client, **kw)
    many = chat(client, n=3, **kw)
    assert [c.index for c in many.choices] == [0, 1, 2]
    assert many.choices[0].message.content == one.choices[0].message.content
    assert len({c.message.content for c in many.choices}) == 3
    assert many.usage.prompt_tokens == one.usage.prompt_tokens
    assert many.usage.completion_tokens == sum(
        chat(client, temperature=1.0, seed=21 + i, max_tokens=12).usage.completion_tokens for i in range(3))
    stream = list(chat(client, n=3, stream=True, stream_options={"include_usage": True}, **kw))
    for c in many.choices:
        deltas = [ch.choices[0].delta for ch in stream if ch.choices and ch.choices[0].index == c.index]
        assert deltas[0].role == "assistant"
        assert "".join(d.content or "" for d in deltas) == c.message.content
    assert stream[-1].usage.completion_tokens == many.usage.completion_tokens
    texts = client.completions.create(model="default", prompt="hi", n=2, max_tokens=4, echo=True, temperature=0)
    assert [c.text[:2] for c in texts.choices] == ["hi", "hi"]


def test_stream_first_chunk_has_the_role_and_include_usage_ends_it(client):
    full = chat(client, temperature=0, max_tokens=10)
    chunks = list(chat(client, temperature=0, max_tokens=10, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == full.usage.model_dump()
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == full.choices[0].message.content
    no_usage = list(chat(client, temperature=0, max_tokens=4, stream=True))
    assert all(c.usage is None and c.choices for c in no_usage)


# ---------------------------------------------------------------- strictness, models


@pytest.mark.parametrize(("extra", "param"), [
    ({"reasoning_effort": "turbo"}, "reasoning_effort"),  # a level no API knows
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"logprobs": True, "top_logprobs": 25}, "top_logprobs"),
    ({"n": 0}, "n"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}}}},
     "response_format"),
])
def test_an_unsupported_value_is_a_400_naming_it(client, extra, param):
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, **extra)
    assert err.value.status_code == 400
    assert err.value.body["param"] == param


def test_unknown_extra_fields_are_tolerated(client):
    r = chat(client, max_tokens=2, extra_body={"store": False, "metadata": {"k": "v"}, "some_vendor_knob": 1})
    assert r.choices[0].finish_reason in ("stop", "length")


def test_models_show_context_length_and_owner(client):
    listed = client.models.list().data
    one = client.models.retrieve("demo-tiny")
    assert [m.id for m in listed] == [one.id] == ["demo-tiny"]
    assert one.owned_by == "mlx-cluster-serve"
    assert one.model_extra["context_length"] == 131072
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
