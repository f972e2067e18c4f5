"""KV_BITS=8 and 4 served by the cache kinds the default model lacks: MLA's latent (zoo-deepseek-v3-wide) and sliding
windows beside full attention (zoo-ministral3-wide, window 32, prompts longer than it), heads 64 wide so a group of
64 divides them. Greedy answers at 8 bits are float KV's (mlx-lm alone, its own float cache); at either precision
an answer is the same from the prefix cache, with n > 1 and in a batch, and /health names the precision."""

from __future__ import annotations

import concurrent.futures as cf
import json
import urllib.request

import pytest

from tests.harness import MODEL_CACHE, assert_engine_logs_clean, serving, wait_for

# past the window of 32 and past one quantization group of 64 positions
CHATS = ["the quick brown fox jumps over a lazy dog " * 5, "Tell me a story about a cluster of Macs, please.",
         "hello"]
MAX_TOKENS = 12
CASES = [(model, bits) for model in ("deepseek-v3-wide", "ministral3-wide") for bits in ("8", "4")]


@pytest.fixture(scope="module", params=CASES, ids=[f"{m}-{b}bits" for m, b in CASES])
def served(request):
    model, bits = request.param
    with serving("zoo-" + model, KV_BITS=bits, KV_GROUP_SIZE="64") as (stack, client):
        yield model, bits, stack, client
    assert_engine_logs_clean(stack)


_floats: dict[str, list[str]] = {}


def float_answers(model: str) -> list[str]:
    """Each chat's greedy answer from mlx-lm alone with its float KV cache (computed once a model)."""
    if model not in _floats:
        import mlx.core as mx
        from mlx_lm import load, stream_generate
        from mlx_lm.sample_utils import make_sampler

        from engine.zoo import ensure_zoo_model

        lm, tokenizer = load(str(ensure_zoo_model(model, MODEL_CACHE)))

        def greedy(content: str) -> str:
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
            steps = stream_generate(lm, tokenizer, prompt, max_tokens=MAX_TOKENS, sampler=make_sampler(temp=0.0))
            return tokenizer.decode([r.token for r in steps if r.token not in tokenizer.eos_token_ids])

        _floats[model] = [greedy(c) for c in CHATS]
        del lm
        mx.clear_cache()
    return _floats[model]


def _ask(client, content: str, **more):
    return client.chat.completions.create(model="default", messages=[{"role": "user", "content": content}],
                                          max_tokens=MAX_TOKENS, temperature=0, **more)


def test_answers_hold_from_the_prefix_cache_with_n_and_in_a_batch_and_match_float_at_8_bits(served):
    model, bits, stack, client = served
    kv = json.loads(urllib.request.urlopen(stack.base_url + "/health", timeout=30).read())["kv_memory"]
    assert (kv["bits"], kv["group_size"]) == (int(bits), 64)
    alone = [_ask(client, c).choices[0].message.content for c in CHATS]
    assert all(alone)
    if bits == "8":
        assert alone == float_answers(model)
    # the first chat again, now from the prefix cache (its entry may land a step after the answer): stored at this
    # precision and reused as such
    again = wait_for(lambda: (r := _ask(client, CHATS[0])).usage.prompt_tokens_details.cached_tokens and r, 60,
                     "a prefix cache hit")
    assert again.choices[0].message.content == alone[0]
    assert [c.message.content for c in _ask(client, CHATS[1], n=2).choices] == [alone[1]] * 2
    with cf.ThreadPoolExecutor(len(CHATS)) as pool:  # one batch, every row quantized on its own
        assert list(pool.map(lambda c: _ask(client, c).choices[0].message.content, CHATS)) == alone
