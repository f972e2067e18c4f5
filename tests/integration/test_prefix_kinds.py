"""The prefix cache on models whose caches cannot be cut (linear attention: Qwen3.5, Qwen3-Next) or stop being
cuttable once their sliding window wraps (gpt-oss): an agent's next turns start from the previous prompt's end,
other conversations from where conversations on the same system prompt part, and every answer is
byte-identical to an engine without the cache."""

from __future__ import annotations

import concurrent.futures as cf

import httpx
import pytest

from tests.harness import Stack, assert_engine_logs_clean

# far longer than the zoo's 32-token sliding window, like an agent's instructions
SYSTEM = " ".join(f"Rule {i}: keep the answer short and cite file {i % 7}.py." for i in range(24))
# Qwen3-Next's linear-attention states are kept as Qwen3.5's are: CI_SLOW=1 runs it
ONE_RANK = ["gpt-oss", "qwen3.5", pytest.param("qwen3-next", marks=pytest.mark.slow)]


def chat(base: str, messages: list[dict]) -> dict:
    r = httpx.post(base + "/v1/chat/completions", timeout=300, json={
        "model": "default", "messages": messages, "max_tokens": 10, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def agent_session(name: str, cache_bytes: str, ranks: int = 1) -> dict[str, list[dict]]:
    """Three turns of one conversation (each resends the whole history), then three other conversations on its
    system prompt, then four at once on a new one; checks the engine's log."""
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
            others = [chat(stack.base_url, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
                      for q in ("List the rules about file 2.py.", "Summarise rule 9.", "Quote rule 11.")]
            system = "Another agent. " + SYSTEM
            with cf.ThreadPoolExecutor(4) as pool:
                concurrent = list(pool.map(lambda i: chat(stack.base_url, [
                    {"role": "system", "content": system}, {"role": "user", "content": f"Task {i}."}]), range(4)))
            assert stack.probe()["ranks"] == ranks  # no rank ended
        finally:
            api.stop()
    finally:
        engine.stop()
    assert_engine_logs_clean(stack)
    return {"turns": turns, "others": others, "concurrent": concurrent}


def texts(session: dict[str, list[dict]]) -> dict[str, list[str]]:
    return {k: [r["choices"][0]["message"]["content"] for r in v] for k, v in session.items()}


def cached(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def check_reuse_and_identical_answers(name: str, ranks: int = 1) -> None:
    on = agent_session(name, str(64 << 20), ranks)
    off = agent_session(name, "0", ranks)
    for before, turn in zip(on["turns"], on["turns"][1:]):
        assert cached(turn) >= 0.9 * before["usage"]["prompt_tokens"], (cached(turn), before["usage"])
    # the later other conversations start where the first parted from the agent's: after the system prompt
    for other in on["others"][1:]:
        assert cached(other) >= 0.9 * other["usage"]["prompt_tokens"], other["usage"]
    # four at once on a new system prompt: the first two compute it (the first to arrive alone parts from no
    # one), the others start where those two part
    assert sum(cached(r) for r in on["concurrent"]) >= 2 * 0.9 * on["concurrent"][0]["usage"]["prompt_tokens"]
    assert not any(cached(r) for v in off.values() for r in v)
    assert texts(on) == texts(off)


@pytest.mark.parametrize("name", ONE_RANK)
def test_an_agents_next_turns_start_from_its_last_prompt_and_answer_as_without_the_cache(name: str) -> None:
    check_reuse_and_identical_answers(name)
