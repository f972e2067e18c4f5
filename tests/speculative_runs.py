"""Greedy answers and speculation's counters from a real engine with SPECULATIVE set: 1 rank or several."""

from __future__ import annotations

import concurrent.futures as cf

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import Stack

# A text that repeats: prompt lookup finds the answer's last tokens earlier and proposes what followed them.
VERSE = "the quick brown fox jumps over the lazy dog and runs back to the old red barn by the river. "
PROMPTS = [VERSE * 6 + "the quick brown", "count: one two three four five six seven eight nine ten one two three",
           "hello"]
COUNTERS = ("mcs_spec_proposed_tokens_total", "mcs_spec_accepted_tokens_total", "mcs_spec_forward_passes_total",
            "mcs_spec_emitted_tokens_total", "mcs_spec_tokens_per_forward")


def counters(base_url: str) -> dict[str, float]:
    text = httpx.get(base_url + "/metrics", timeout=10).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name in COUNTERS}


def greedy_answers(ranks: int, speculative: str, max_tokens: int = 160) -> tuple:
    """(greedy chat answers, greedy completion texts, /metrics counters, /health's speculative block, seeded sampled
    texts: seeds 1 and 2 alone, seed 1 beside six other requests) of one engine."""
    s = Stack()
    engine = s.start_engine(ranks=ranks, SPECULATIVE=speculative, NUM_DRAFT_TOKENS="4")
    api = s.start_api()
    try:
        with httpx.Client(base_url=s.base_url, timeout=300) as http:
            chats, texts = [], []
            for prompt in PROMPTS:
                r = http.post("/v1/chat/completions", json={
                    "model": "default", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                    "temperature": 0})
                assert r.status_code == 200, r.text
                chats.append(r.json()["choices"][0]["message"]["content"])
                r = http.post("/v1/completions", json={"model": "default", "prompt": prompt, "max_tokens": max_tokens,
                                                       "temperature": 0})
                assert r.status_code == 200, r.text
                texts.append(r.json()["choices"][0]["text"])
            def sampled(seed: int) -> str:
                # two tokens of like odds: their n-grams recur, so prompt lookup proposes drafts the sampler keeps
                # about half the time (the demo's own sampled text is too random to get any)
                r = http.post("/v1/completions", json={"model": "default", "prompt": PROMPTS[0], "max_tokens": 60,
                                                       "temperature": 1.0, "seed": seed,
                                                       "logit_bias": {"300": 100, "301": 100}})
                assert r.status_code == 200, r.text
                return r.json()["choices"][0]["text"]

            # together: sequences join, end (length, a stop string) and leave a batch while others get drafts;
            # the last is seeded 1 and sampled, its drafts now depending on the batch
            def one(i: int) -> str:
                if i == 6:
                    return sampled(1)
                body = {"model": "default", "prompt": PROMPTS[i % len(PROMPTS)], "temperature": 0,
                        "max_tokens": 40 + 25 * i, **({"stop": ["barn"]} if i == 3 else {})}
                r = http.post("/v1/completions", json=body)
                assert r.status_code == 200, r.text
                return r.json()["choices"][0]["text"]

            with cf.ThreadPoolExecutor(7) as pool:
                *together, loaded = pool.map(one, range(7))
            texts += together
            # sampled, seeded: alone and under load, the answers plain decoding gives
            seeded = [sampled(1), sampled(2), loaded]
            health = http.get("/health").json()
        assert s.probe() is not None  # no desync ended the engine
        return chats, texts, counters(s.base_url), health["speculative"], seeded
    finally:
        api.stop()
        engine.stop()
