"""KV_BITS=8 on two ranks spawned by mlx.launch, tensor parallel (each rank quantizes its own heads) and, with
CI_SLOW=1, pipeline (each its own layers): greedy answers, alone, concurrent and from the prefix cache, are one process's with mlx-lm's
QuantizedKVCache, and no rank falls out of step."""

from __future__ import annotations

import concurrent.futures as cf
from itertools import islice

import httpx
import pytest

from tests.harness import MODEL_CACHE, Stack, wait_for

pytestmark = pytest.mark.multirank

# (model, parallel mode, group): demo-small (Qwen3: no pipeline() in mlx-lm) has head vectors of 32, the smallest
# group mx.quantize takes, and 8 query and 4 KV heads that split in two; SmolLM2 (Llama, head vectors of 64) runs
# in pipeline stages, which takes minutes on two CPU ranks: only with CI_SLOW=1
CASES = [("demo-small", "tensor", 32),
         pytest.param("smollm2-135m", "pipeline", 64, marks=pytest.mark.slow)]
PROMPTS = [[7, 99, 13, 250, 31, 8, 8, 1000, 42], [5, 6], list(range(300, 340))]
MAX_TOKENS = 10


def _folder(model: str):
    from engine.demo.store import ensure_demo_model
    from engine.gguf import packaged_model_path

    if model.startswith("demo-"):
        return ensure_demo_model(model.removeprefix("demo-"), MODEL_CACHE)
    return packaged_model_path(model.removeprefix("smollm2-"), MODEL_CACHE)


def _reference(model_name: str, group: int) -> list[dict]:
    """Each prompt's greedy text and token logprobs from one process with mlx-lm's quantized cache, up to the end
    token or MAX_TOKENS; checked to differ from float KV's logprobs, so an engine ignoring KV_BITS fails."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    model, tokenizer = load(str(_folder(model_name)))

    def greedy(prompt, make):
        steps = list(islice(generate_step(mx.array(prompt), model, prompt_cache=[make() for _ in model.layers]),
                            MAX_TOKENS))
        tokens = [int(t) for t, _ in steps]
        ends = [n for n, t in enumerate(tokens) if t in tokenizer.eos_token_ids]
        tokens = tokens[:ends[0]] if ends else tokens
        return {"text": tokenizer.decode(tokens), "logprobs": [float(row[t]) for t, (_, row) in zip(tokens, steps)]}

    out = [greedy(p, lambda: QuantizedKVCache(group, 8)) for p in PROMPTS]
    floats = [greedy(p, KVCache) for p in PROMPTS]
    assert any(abs(a - b) > 1e-2 for q, f in zip(out, floats) for a, b in zip(q["logprobs"], f["logprobs"]))
    del model
    mx.clear_cache()
    return out


def _complete(base: str, prompt: list[int]) -> dict:
    r = httpx.post(base + "/v1/completions", timeout=300, json={
        "model": "default", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": 1})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("model, parallel, group", CASES)
def test_two_ranks_decode_what_one_process_decodes_with_a_quantized_cache(model, parallel, group):
    reference = _reference(model, group)
    # two ranks of SmolLM2 on this machine's CPU take longer than the watchdog's default for their first passes
    s = Stack(extra={"MODEL": model, "KV_BITS": "8", "KV_GROUP_SIZE": str(group), "PARALLEL": parallel,
                     "WATCHDOG_TIMEOUT": "120"})
    engine = s.start_engine(ranks=2, timeout=300)
    api = s.start_api()
    try:
        with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
            together = list(pool.map(lambda p: _complete(s.base_url, p), PROMPTS))
        # from the prefix cache, on both ranks (an answer may reach the client a step before its entry is stored)
        again = wait_for(lambda: (r := _complete(s.base_url, PROMPTS[2]))["usage"]["prompt_tokens_details"]
                         ["cached_tokens"] and r, 60, "a prefix cache hit")
        info = s.probe()
    finally:
        api.stop()
        engine.stop()
    got = [{"text": body["choices"][0]["text"], "logprobs": body["choices"][0]["logprobs"]["token_logprobs"]}
           for body in together + [again]]
    for answer, want in zip(got, reference + reference[2:]):
        assert answer["text"] == want["text"]
        # two ranks sum their partial results in another order: a key a rounding apart can land in the next
        # quantization step, so logprobs agree within 2e-3 (float KV's differ from these by 1e-2 and more)
        assert answer["logprobs"][:len(want["logprobs"])] == pytest.approx(want["logprobs"], abs=2e-3)
    assert info is not None and info["ranks"] == 2 and info["parallel"] == parallel
