"""The prefix cache on two ranks spawned by mlx.launch: every rank holds its shard of the same entries, a second
turn reuses the first, and greedy outputs (one request, 16 concurrent, n > 1) equal an engine without the cache."""

from __future__ import annotations

import concurrent.futures as cf

import httpx
import pytest

from tests.harness import Stack, wait_for

pytestmark = pytest.mark.multirank

SYSTEM = " ".join(f"Rule {i}: answer briefly and cite file {i % 13}.py." for i in range(90))
QUESTIONS = [f"Question {i}: which rule names file {i}.py?" for i in range(16)]


def chat(base: str, user: str, history: list[dict] = (), **kw) -> dict:
    messages = [{"role": "system", "content": SYSTEM}, *history, {"role": "user", "content": user}]
    r = httpx.post(base + "/v1/chat/completions", timeout=300, json={
        "model": "default", "messages": messages, "max_tokens": 10, "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def session(cache_bytes: str) -> dict:
    """Everything a client sees of one scripted session on two ranks."""
    s = Stack(extra={"PROMPT_CACHE_BYTES": cache_bytes})
    engine = s.start_engine(ranks=2)
    api = s.start_api()
    try:
        one = chat(s.base_url, "Which file holds rule 5?")
        answer = one["choices"][0]["message"]["content"]
        two = chat(s.base_url, "And rule 6?", [{"role": "user", "content": "Which file holds rule 5?"},
                                               {"role": "assistant", "content": answer}])
        with cf.ThreadPoolExecutor(16) as pool:
            concurrent = list(pool.map(lambda q: chat(s.base_url, q)["choices"][0]["message"]["content"], QUESTIONS))
        several = chat(s.base_url, "Pick rules.", n=3, temperature=0.8, seed=5)
        # every rank holds its shard of the entries (rank reports arrive about once a second)
        info = wait_for(lambda: (i := s.probe()) and all(r["prompt_cache_bytes"] for r in i["rank_states"]) and i,
                        30, "every rank to report prefix cache bytes") if cache_bytes != "0" else s.probe()
        assert info is not None and info["ranks"] == 2 and info["active"] == 0  # no desync ended the engine
        return {"one": one, "two": two, "concurrent": concurrent, "several": several, "info": info}
    finally:
        api.stop()
        engine.stop()


def text(body: dict) -> list[str]:
    return [c["message"]["content"] for c in body["choices"]]


def test_two_ranks_with_the_cache_answer_as_without_it():
    on = session(str(64 << 20))
    off = session("0")
    cached = on["two"]["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= on["one"]["usage"]["prompt_tokens"] - 8
    assert off["two"]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    for key in ("one", "two", "several"):
        assert text(on[key]) == text(off[key]), key
    assert on["concurrent"] == off["concurrent"]
    assert on["info"]["prompt_cache_hits"] >= 16
    assert len({r["prompt_cache_bytes"] for r in on["info"]["rank_states"]}) == 1  # equal shards of the same entries
