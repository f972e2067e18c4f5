"""Two real ranks spawned by mlx.launch over the ring backend on loopback."""

from __future__ import annotations

import concurrent.futures as cf
import re

import openai
import pytest

from bench.perplexity import api_logprobs, inprocess_logprobs, model_folder
from tests.harness import MODEL_CACHE, REPO, Stack

pytestmark = pytest.mark.multirank

WORDS = "the quick brown fox jumps over a lazy dog while seven cats watch from the warm roof".split()
# 16 prompts of different lengths; concurrency must not change any of their greedy outputs.
PROMPTS = [" ".join(WORDS[(i * 5 + k) % len(WORDS)] for k in range(1 + 3 * i)) for i in range(16)]
# A prompt whose plan is larger than one 4096-byte broadcast buffer (sent in several chunks).
LONG_PROMPT = [(7 * k) % 900 + 10 for k in range(2500)]
# scored through the API (prompt logprobs) while the batch decodes: more than one prefill chunk
SCORED = (REPO / "docs" / "openai.md").read_text()[:2400]


def greedy(client, content: str) -> str:
    r = client.chat.completions.create(model="default", messages=[{"role": "user", "content": content}],
                                       max_tokens=8 + len(content) % 17, temperature=0)
    assert r.usage.completion_tokens > 0
    return r.choices[0].message.content


def greedy_long(client) -> str:
    return client.completions.create(model="default", prompt=LONG_PROMPT, max_tokens=8, temperature=0).choices[0].text


def serve(ranks: int):
    s = Stack()
    engine = s.start_engine(ranks=ranks)
    api = s.start_api()
    client = openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0, timeout=120)
    return s, engine, api, client


@pytest.fixture(scope="module")
def outputs_one_rank():
    s, engine, api, client = serve(1)
    try:
        return {p: greedy(client, p) for p in PROMPTS}, greedy_long(client)
    finally:
        client.close()
        api.stop()
        engine.stop()


def test_two_ranks_match_one_rank_and_survive_concurrency(outputs_one_rank):
    single, single_long = outputs_one_rank
    s, engine, api, client = serve(2)
    try:
        info = s.probe()
        assert info["ranks"] == 2 and info["backend"] == "ring" and info["parallel"] == "tensor"
        # Sequential greedy requests: byte-identical to the single-rank engine.
        for p in PROMPTS:
            assert greedy(client, p) == single[p], p
        # Concurrent requests share the batch and still give each prompt its own output.
        with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
            long_future = pool.submit(greedy_long, client)
            scored = pool.submit(api_logprobs, client, SCORED)  # every rank computes the prompt's logits alike
            got = dict(zip(PROMPTS, pool.map(lambda p: greedy(client, p), PROMPTS)))
            assert long_future.result() == single_long
        assert got == single
        served, local = scored.result()[1], inprocess_logprobs(model_folder("demo-tiny", MODEL_CACHE), SCORED)
        assert len(served) == len(local) and max(abs(a - b) for a, b in zip(served[1:], local[1:])) < 1e-3
        # Seeded sampling is identical on every rank (a desync would end the engine).
        kw = dict(model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=16,
                  temperature=0.9, seed=7)
        assert (client.chat.completions.create(**kw).choices[0].message.content
                == client.chat.completions.create(**kw).choices[0].message.content)
        states = s.probe()["rank_states"]  # reported through the step protocol about once a second
        assert [st["rank"] for st in states] == [0, 1]
        assert len({st["pid"] for st in states}) == 2
        assert all(st["active_memory"] > 0 and st["host_memory_total"] > 0 for st in states)
        log = engine.log.read_text()
        assert re.search(r"rank1 .*rank 1 of 2 joined", log), log[-2000:]
    finally:
        client.close()
        api.stop()
        engine.stop()
    assert not engine.alive()
