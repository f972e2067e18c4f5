"""Every zoo family served by the real engine on one rank gives the greedy tokens mlx-lm gives in-process, with
the prefix cache off and on (a second request that shares the first's prompt starts from its entry).

The prompt is longer than the sliding-window models' 32-token window, so their caches wrap; the hybrids'
linear-attention state is exercised from the first token.
"""

from __future__ import annotations

import httpx
import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.generate import stream_generate

from engine.zoo import FAMILIES, ensure_zoo_model
from tests.harness import MODEL_CACHE, Stack, assert_engine_logs_clean

TEXT = ("The cluster's four Macs share one model over Thunderbolt; each rank holds a slice of every layer, and "
        "rank zero broadcasts the plan of every step so that all of them decode in lockstep. ") * 6
MAX_TOKENS = 12
# quantized models of two cache kinds: 4-bit weights through the same paths
FAMILIES_AND_4BIT = (*FAMILIES, "qwen3.5-4bit", "gpt-oss-4bit")


def reference(name: str) -> tuple[list[int], list[str]]:
    """(the prompt's ids, mlx-lm's greedy texts for it and for its first 200 tokens plus a new ending)."""
    model, tokenizer = load(str(ensure_zoo_model(name, MODEL_CACHE)))
    prompt = tokenizer.encode(TEXT)
    texts = []
    for ids in (prompt, prompt[:200] + prompt[:40]):
        steps = list(stream_generate(model, tokenizer, ids, max_tokens=MAX_TOKENS,
                                     sampler=lambda logprobs: mx.argmax(logprobs, axis=-1)))
        tokens = [r.token for r in steps if not (r.finish_reason == "stop" and r is steps[-1])]
        texts.append(tokenizer.decode(tokens))
    return prompt, texts


def served(name: str, prompts: list[list[int]], **settings: str) -> tuple[list[str], list[int]]:
    """(greedy texts, cached prompt tokens) of the prompts sent one after another to the engine."""
    stack = Stack(extra={"MODEL": "zoo-" + name, **settings})
    engine = stack.start_engine()
    try:
        api = stack.start_api()
        try:
            texts, cached = [], []
            for ids in prompts:
                r = httpx.post(stack.base_url + "/v1/completions", timeout=120, json={
                    "model": "default", "prompt": ids, "max_tokens": MAX_TOKENS, "temperature": 0})
                assert r.status_code == 200, r.text
                body = r.json()
                texts.append(body["choices"][0]["text"])
                cached.append((body["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        finally:
            api.stop()
    finally:
        engine.stop()
    assert_engine_logs_clean(stack)
    return texts, cached


@pytest.mark.parametrize("name", FAMILIES_AND_4BIT)
def test_greedy_tokens_equal_mlx_lm_in_process_with_the_prefix_cache_off_and_on(name: str) -> None:
    prompt, expected = reference(name)
    prompts = [prompt, prompt[:200] + prompt[:40]]
    off, _ = served(name, prompts, PROMPT_CACHE_BYTES="0")
    on, _ = served(name, prompts)
    assert off == expected, f"zoo-{name}, cache off: the engine's greedy text differs from mlx-lm's"
    assert on == expected, f"zoo-{name}, cache on: the engine's greedy text differs from mlx-lm's"
