"""A long prompt stays correct across ranks: an 8k-token prompt with a fact placed early (a needle) gives the same
greedy answer on one rank and on two, in tensor and in pipeline parallel, with the prefix cache off and on.

The prompt takes many prefill chunks (PREFILL_TOKENS_PER_STEP), which is where multi-chunk prefill under tensor
parallelism has corrupted output before; the second question reuses the first's 8k tokens from the prefix cache.
"""

from __future__ import annotations

import httpx
import pytest
from tokenizers import Tokenizer

from engine.zoo import ensure_zoo_model
from tests.harness import MODEL_CACHE, Stack, assert_engine_logs_clean

pytestmark = pytest.mark.multirank

MODEL = "ministral3"  # sliding-window and full attention layers; has both shard() and pipeline()
NEEDLE = "Remember this: the vault code is 4711 and the vault is in Oslo. "
FILLER = "The cluster hums along; ranks exchange partial sums and nothing of note happens. "
QUESTIONS = [" Question: what is the vault code? Answer:", " Question: where is the vault? Answer:"]


def prompts() -> list[list[int]]:
    tok = Tokenizer.from_file(str(ensure_zoo_model(MODEL, MODEL_CACHE) / "tokenizer.json"))
    haystack = tok.encode(NEEDLE + FILLER * 600).ids[:8000]
    return [haystack + tok.encode(q).ids for q in QUESTIONS]


def answers(ranks: int, **settings: str) -> list[str]:
    extra = {"MODEL": "zoo-" + MODEL, **settings}
    if ranks > 1:
        extra["HOSTS"] = ",".join(["127.0.0.1"] * ranks)
    stack = Stack(extra=extra)
    engine = stack.start_engine(ranks=ranks)
    try:
        api = stack.start_api()
        try:
            out = []
            for ids in prompts():
                r = httpx.post(stack.base_url + "/v1/completions", timeout=300, json={
                    "model": "default", "prompt": ids, "max_tokens": 8, "temperature": 0})
                assert r.status_code == 200, r.text
                out.append(r.json()["choices"][0]["text"])
        finally:
            api.stop()
    finally:
        engine.stop()
    assert_engine_logs_clean(stack)
    return out


def test_an_8k_prompt_answers_alike_on_one_and_two_ranks_tensor_and_pipeline_cache_on_and_off():
    expected = answers(1, PROMPT_CACHE_BYTES="0")
    runs = {
        "1 rank, cache on": answers(1),
        "2 ranks tensor, cache off": answers(2, PARALLEL="tensor", PROMPT_CACHE_BYTES="0"),
        "2 ranks tensor, cache on": answers(2, PARALLEL="tensor"),
        "2 ranks pipeline, cache off": answers(2, PARALLEL="pipeline", PROMPT_CACHE_BYTES="0"),
        "2 ranks pipeline, cache on": answers(2, PARALLEL="pipeline"),
    }
    differ = {k: v for k, v in runs.items() if v != expected}
    assert not differ, f"1 rank, cache off answered {expected}; these differ: {differ}"
