"""The prefix cache on models whose caches cannot be cut (linear attention: Qwen3.5, Qwen3-Next) or stop being
cuttable once their sliding window wraps (gpt-oss): an agent's next turns start from the previous prompt's end,
and every answer is byte-identical to an engine without the cache."""

from __future__ import annotations

import httpx
import pytest

from tests.harness import Stack

# far longer than the zoo's 32-token sliding window, like an agent's instructions
SYSTEM = " ".join(f"Rule {i}: keep the answer short and cite file {i % 7}.py." for i in range(24))
ONE_RANK = ["gpt-oss", "qwen3.5", "qwen3-next"]


def chat(base: str, messages: list[dict]) -> dict:
    r = httpx.post(base + "/v1/chat/completions", timeout=300, json={
        "model": "default", "messages": messages, "max_tokens": 10, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def agent_session(name: str, cache_bytes: str, ranks: int = 1) -> list[dict]:
    """Three turns of one conversation (each resends the whole history), and the engine's log."""
    stack = Stack(extra={"MODEL": "zoo-" + name, "PROMPT_CACHE_BYTES": cache_bytes})
    engine = stack.start_engine(ranks=ranks)
    try:
        api = stack.start_api()
        try:
            messages = [{"role": "system", "content": SYSTEM}]
            turns = []
            for question in ("Which file holds rule 3?", "And rule 4?", "And rule 5?"):
                messages.append({"role": "user", "content": question})
                turns.append(chat(stack.base_url, messages))
                messages.append({"role": "assistant", "content": turns[-1]["choices"][0]["message"]["content"]})
            assert stack.probe()["ranks"] == ranks  # no rank ended
        finally:
            api.stop()
    finally:
        engine.stop()
    log = "".join(p.read_text(errors="replace") for p in stack.root.glob("engine-*.log"))
    assert "ERROR" not in log and "Traceback" not in log, log[-3000:]
    return turns


def check_reuse_and_identical_answers(name: str, ranks: int = 1) -> None:
    on = agent_session(name, str(64 << 20), ranks)
    off = agent_session(name, "0", ranks)
    for before, turn in zip(on, on[1:]):
        cached = turn["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= 0.9 * before["usage"]["prompt_tokens"], (cached, before["usage"])
    assert all(t["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 for t in off)
    assert [t["choices"][0]["message"]["content"] for t in on] == [t["choices"][0]["message"]["content"] for t in off]
    assert [t["usage"] for t in on][0] == [t["usage"] for t in off][0]


@pytest.mark.parametrize("name", ONE_RANK)
def test_an_agents_next_turns_start_from_its_last_prompt_and_answer_as_without_the_cache(name: str) -> None:
    check_reuse_and_identical_answers(name)
