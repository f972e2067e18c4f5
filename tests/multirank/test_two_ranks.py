"""Two real ranks spawned by mlx.launch over the ring backend on loopback."""

from __future__ import annotations

import concurrent.futures as cf
import re

import openai
import pytest

from tests.harness import Stack

pytestmark = pytest.mark.multirank

PROMPTS = ["hello", "The weather in Paris", "tell me a story about a cat", "1 2 3 4", "{\"name\": \"x\"}"]


def greedy(client, content: str, max_tokens: int = 24) -> str:
    r = client.chat.completions.create(model="default", messages=[{"role": "user", "content": content}],
                                       max_tokens=max_tokens, temperature=0)
    assert r.usage.completion_tokens > 0
    return r.choices[0].message.content


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
        return {p: greedy(client, p) for p in PROMPTS}
    finally:
        client.close()
        api.stop()
        engine.stop()


def test_two_ranks_match_one_rank_and_survive_concurrency(outputs_one_rank):
    single = outputs_one_rank
    s, engine, api, client = serve(2)
    try:
        info = s.probe()
        assert info["ranks"] == 2 and info["backend"] == "ring"
        # Sequential greedy requests: byte-identical to the single-rank engine.
        for p in PROMPTS:
            assert greedy(client, p) == single[p], p
        # Concurrent requests share the batch and still give each prompt its own output.
        with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
            got = dict(zip(PROMPTS, pool.map(lambda p: greedy(client, p), PROMPTS)))
        assert got == single
        # Seeded sampling is identical on every rank (a desync would end the engine).
        kw = dict(model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=16,
                  temperature=0.9, seed=7)
        assert (client.chat.completions.create(**kw).choices[0].message.content
                == client.chat.completions.create(**kw).choices[0].message.content)
        assert s.probe() is not None
        log = engine.log.read_text()
        assert re.search(r"rank1 .*rank 1 of 2 joined", log), log[-2000:]
    finally:
        client.close()
        api.stop()
        engine.stop()
    assert not engine.alive()
