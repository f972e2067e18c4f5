"""KV_BITS=8 on two ranks spawned by mlx.launch, tensor parallel (each rank quantizes its own heads) and pipeline
(each its own layers): greedy answers, alone, concurrent and from the prefix cache, are one process's with mlx-lm's
QuantizedKVCache, and no rank falls out of step."""

from __future__ import annotations

import concurrent.futures as cf
from itertools import islice

import httpx
import pytest

from tests.harness import MODEL_CACHE, Stack

pytestmark = pytest.mark.multirank

MODEL = "demo-small"  # head vectors of 32: the smallest group mx.quantize takes; 8 query and 4 KV heads split in two
GROUP = 32
PROMPTS = [[7, 99, 13, 250, 31, 8, 8, 1000, 42], [5, 6], list(range(300, 340))]
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def reference() -> list[str]:
    """Each prompt's greedy text from one process, up to the end token or MAX_TOKENS."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import QuantizedKVCache

    from engine.demo.store import ensure_demo_model

    model, tokenizer = load(str(ensure_demo_model(MODEL.removeprefix("demo-"), MODEL_CACHE)))
    out = []
    for p in PROMPTS:
        cache = [QuantizedKVCache(GROUP, 8) for _ in model.layers]
        tokens = [int(t) for t, _ in islice(generate_step(mx.array(p), model, prompt_cache=cache), MAX_TOKENS)]
        ends = [n for n, t in enumerate(tokens) if t in tokenizer.eos_token_ids]
        out.append(tokenizer.decode(tokens[:ends[0]] if ends else tokens))
    del model
    mx.clear_cache()
    return out


def _complete(base: str, prompt: list[int]) -> dict:
    r = httpx.post(base + "/v1/completions", timeout=300, json={
        "model": "default", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("parallel", ["tensor", "pipeline"])
def test_two_ranks_decode_what_one_process_decodes_with_a_quantized_cache(parallel, reference):
    s = Stack(extra={"MODEL": MODEL, "KV_BITS": "8", "KV_GROUP_SIZE": str(GROUP), "PARALLEL": parallel})
    engine = s.start_engine(ranks=2)
    api = s.start_api()
    try:
        with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
            together = list(pool.map(lambda p: _complete(s.base_url, p), PROMPTS))
        again = _complete(s.base_url, PROMPTS[2])  # from the prefix cache, on both ranks
        info = s.probe()
    finally:
        api.stop()
        engine.stop()
    texts = [body["choices"][0]["text"] for body in together + [again]]
    assert texts[:3] == reference
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0 and texts[3] == reference[2]
    assert info is not None and info["ranks"] == 2 and info["parallel"] == parallel
