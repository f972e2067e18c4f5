"""The prefix cache on the real engine: agent turns reuse what earlier turns computed, and nothing a client
sees changes (greedy outputs byte-identical to an engine without the cache)."""

from __future__ import annotations

import concurrent.futures as cf

import httpx
import pytest

from tests.harness import Stack, wait_for

# ~1200 demo tokens of system prompt, like an agent's instructions (bench/agent_replay.py measures ~3k)
SYSTEM = " ".join(f"Rule {i}: keep the answer short, cite file {i % 17}.py and never guess." for i in range(70))


def chat(base: str, messages: list[dict], **kw) -> dict:
    r = httpx.post(base + "/v1/chat/completions", timeout=300, json={
        "model": "default", "messages": messages, "max_tokens": 12, "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def conversation(user: str, answer: str | None = None, follow_up: str | None = None,
                 system: str = SYSTEM) -> list[dict]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    if answer is not None:
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": follow_up}]
    return messages


@pytest.fixture(scope="module")
def uncached():
    """An engine with PROMPT_CACHE_BYTES=0: the outputs the cache must not change."""
    s = Stack(extra={"PROMPT_CACHE_BYTES": "0"})
    engine, api = s.start_engine(), s.start_api()
    yield s.base_url
    api.stop()
    engine.stop()


@pytest.fixture(scope="module")
def cached():
    s = Stack(extra={"PROMPT_CACHE_BYTES": str(256 << 20)})
    engine, api = s.start_engine(), s.start_api()
    s.procs = {"engine": engine, "api": api}
    yield s
    api.stop()
    engine.stop()


def test_turn_two_reuses_turn_one_and_answers_the_same(cached, uncached):
    base = cached.base_url
    one = chat(base, conversation("Which file holds rule 7?"))
    assert one["usage"]["prompt_tokens"] > 1000
    answer = one["choices"][0]["message"]["content"]
    two = chat(base, conversation("Which file holds rule 7?", answer, "And rule 8?"))
    cached_tokens = two["usage"]["prompt_tokens_details"]["cached_tokens"]
    # everything of turn one but the last template tokens (its answer re-rendered may differ at the end)
    assert cached_tokens >= one["usage"]["prompt_tokens"] - 8
    reference = chat(uncached, conversation("Which file holds rule 7?", answer, "And rule 8?"))
    assert reference["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert two["choices"][0]["message"]["content"] == reference["choices"][0]["message"]["content"]
    assert two["usage"]["prompt_tokens"] == reference["usage"]["prompt_tokens"]


def test_short_chats_reuse_the_template_header_and_answer_the_same(cached, uncached):
    # No system prompt: two different one-line questions share only the chat template's first tokens. Those
    # come from the first one's entry, and the second answers exactly as it does without the cache.
    base = cached.base_url
    chat(base, [{"role": "user", "content": "Note 1: a few lines about bread."}])
    two = chat(base, [{"role": "user", "content": "Note 2: a few lines about the moon."}])
    assert two["usage"]["prompt_tokens_details"]["cached_tokens"] >= 4
    reference = chat(uncached, [{"role": "user", "content": "Note 2: a few lines about the moon."}])
    assert two["choices"][0]["message"]["content"] == reference["choices"][0]["message"]["content"]


def test_sixteen_concurrent_requests_sharing_a_system_prompt_answer_as_without_the_cache(cached, uncached):
    questions = [f"Question {i}: which rule mentions file {i}.py?" for i in range(16)]

    def answers(base: str) -> list[str]:
        with cf.ThreadPoolExecutor(16) as pool:
            done = list(pool.map(lambda q: chat(base, conversation(q)), questions))
        return [d["choices"][0]["message"]["content"] for d in done]

    chat(cached.base_url, conversation("warm the system prompt"))
    assert answers(cached.base_url) == answers(uncached)
    info = cached.probe()
    assert info["prompt_cache_hits"] >= 16 and info["active"] == 0


def test_concurrent_requests_with_a_new_system_prompt_compute_it_once(cached, uncached):
    system = "Another agent. " + SYSTEM  # nothing cached starts like it
    questions = [f"Task {i}: list the rules about file {i}.py." for i in range(8)]
    before = cached.probe()

    def answers(base: str) -> list[str]:
        with cf.ThreadPoolExecutor(8) as pool:
            done = list(pool.map(lambda q: chat(base, conversation(q, system=system)), questions))
        return [d["choices"][0]["message"]["content"] for d in done]

    assert answers(cached.base_url) == answers(uncached)
    after = cached.probe()
    received = after["prompt_tokens_total"] - before["prompt_tokens_total"]
    computed = received - (after["prompt_tokens_cached"] - before["prompt_tokens_cached"])
    # the first request computes the system prompt; the other seven start from its KV
    assert computed <= received / 4, (computed, received)


def test_several_choices_answer_as_without_the_cache(cached, uncached):
    body = {"n": 3, "temperature": 0.9, "seed": 11}
    chat(cached.base_url, conversation("warm up"))
    got = chat(cached.base_url, conversation("Pick three rules."), **body)
    want = chat(uncached, conversation("Pick three rules."), **body)
    assert got["usage"]["prompt_tokens_details"]["cached_tokens"] > 1000
    assert [c["message"]["content"] for c in got["choices"]] == [c["message"]["content"] for c in want["choices"]]


def test_the_cache_is_reported_in_health_and_metrics(cached):
    chat(cached.base_url, conversation("Report."))
    health = httpx.get(cached.base_url + "/health", timeout=10).json()
    cache = health["prompt_cache"]
    assert cache["budget_bytes"] == 256 << 20 and 0 < cache["bytes"] <= cache["budget_bytes"] and cache["entries"] >= 1
    # rank 0 reports its own shard's bytes about once a second
    wait_for(lambda: (i := cached.probe()) and i["rank_states"][0]["prompt_cache_bytes"] > 0, 30,
             "rank 0 to report its prefix cache bytes")
    metrics = httpx.get(cached.base_url + "/metrics", timeout=10).text
    for name in ("mcs_prompt_cache_bytes", "mcs_prompt_cache_hits_total", "mcs_prompt_cache_tokens_total",
                 "mcs_engine_prompt_tokens_total", "mcs_rank_prompt_cache_bytes"):
        assert name in metrics, name


def test_a_budget_far_below_the_working_set_evicts_and_keeps_serving():
    s = Stack(extra={"PROMPT_CACHE_BYTES": str(2 << 20)})  # about one conversation of the demo model
    engine, api = s.start_engine(), s.start_api()
    try:
        for i in range(4):
            one = chat(s.base_url, conversation(f"Conversation {i}."))
            chat(s.base_url, conversation(f"Conversation {i}.", one["choices"][0]["message"]["content"], "More."))
        info = s.probe()
        assert info["prompt_cache_evictions"] >= 3
        assert info["prompt_cache_bytes"] <= 2 << 20
    finally:
        api.stop()
        engine.stop()
