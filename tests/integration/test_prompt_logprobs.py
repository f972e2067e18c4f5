"""Prompt logprobs through /v1/completions (echo, logprobs, max_tokens 0: what lm-evaluation-harness sends to score a
text) with the official client: OpenAI's legacy shape, mlx-lm's own numbers, the prefix cache on, hostile values."""

from __future__ import annotations

import math

import openai
import pytest

from bench.perplexity import api_logprobs, inprocess_logprobs, perplexity
from tests.harness import REPO

# about 1,300 demo tokens: more than one prefill chunk (PREFILL_TOKENS_PER_STEP, 512)
TEXT = (REPO / "docs" / "openai.md").read_text()[:2400]


def score(client, prompt, **kw):
    return client.completions.create(**{"model": "default", "prompt": prompt, "echo": True, "logprobs": 5,
                                        "max_tokens": 0, **kw})


def test_perplexity_through_the_api_equals_mlx_lm_in_process(client, demo_tiny):
    tokens, served = api_logprobs(client, TEXT)
    local = inprocess_logprobs(demo_tiny, TEXT)
    assert len(served) == len(local) > 1024 and served[0] is None
    assert max(abs(a - b) for a, b in zip(served[1:], local[1:])) < 1e-3
    assert math.isclose(perplexity(served), perplexity(local), rel_tol=1e-3)


def test_scoring_has_the_legacy_shape_and_the_prefix_cache_gives_the_same_logprobs(client):
    prompt = TEXT[:600]
    first = score(client, prompt)
    choice, lp = first.choices[0], first.choices[0].logprobs
    assert (choice.text, choice.finish_reason, first.usage.completion_tokens) == (prompt, "length", 0)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == first.usage.prompt_tokens
    assert "".join(lp.tokens) == prompt
    assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(len(lp.tokens))]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for value, top in zip(lp.token_logprobs[1:], lp.top_logprobs[1:]):
        assert value <= 0 and len(top) == 5 and max(top.values()) >= value - 1e-5
    # the same prompt again: computed again (an entry holds KV, not logits), the same numbers
    again = score(client, prompt)
    assert again.choices[0].logprobs.token_logprobs == lp.token_logprobs
    assert again.choices[0].logprobs.top_logprobs == lp.top_logprobs
    assert again.usage.prompt_tokens_details.cached_tokens == 0
    # ...while its KV was kept: a plain request extending it starts from there
    plain = client.completions.create(model="default", prompt=prompt + " and more", max_tokens=1)
    assert plain.usage.prompt_tokens_details.cached_tokens > 0


def test_echo_with_tokens_gives_the_prompts_logprobs_then_the_answers(client):
    prompt = "The weather in Paris"
    answer = client.completions.create(model="default", prompt=prompt, max_tokens=5, temperature=0, logprobs=0)
    scored = score(client, prompt, max_tokens=5, temperature=0, logprobs=0)
    n = scored.usage.prompt_tokens
    lp = scored.choices[0].logprobs
    assert scored.choices[0].text == prompt + answer.choices[0].text
    assert lp.tokens[n:] == answer.choices[0].logprobs.tokens
    assert [round(v, 4) for v in lp.token_logprobs[n:]] == [round(v, 4) for v in answer.choices[0].logprobs.token_logprobs]
    assert lp.top_logprobs[0] is None and all(top == {} for top in lp.top_logprobs[1:n])
    chunks = [c.choices[0] for c in score(client, prompt, max_tokens=5, temperature=0, logprobs=0, stream=True)
              if c.choices]
    assert "".join(c.text for c in chunks) == scored.choices[0].text
    streamed = [v for c in chunks if c.logprobs for v in c.logprobs.token_logprobs]
    assert [None if v is None else round(v, 4) for v in streamed] == [
        None if v is None else round(v, 4) for v in lp.token_logprobs]


@pytest.mark.parametrize(("kw", "param"), [({"logprobs": 21}, "logprobs"), ({"n": 2}, "n"),
                                           ({"echo": False}, "max_tokens")])
def test_values_it_cannot_serve_are_400s_naming_them(client, kw, param):
    with pytest.raises(openai.BadRequestError) as err:
        score(client, "hello", **kw)
    assert err.value.body["param"] == param

