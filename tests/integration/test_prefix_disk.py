"""The prefix cache's disk tier on the real engine: a conversation's next turn after `restart-engine` restores what
the turn before computed (cached_tokens) and answers exactly as computing it does; another tenant finds none of it."""

from __future__ import annotations

import httpx
import pytest

from tests.harness import Stack, wait_for

KEY_A, KEY_B = "sk-disk-tenant-a-01", "sk-disk-tenant-b-02"
SYSTEM = " ".join(f"Rule {i}: keep the answer short, cite file {i % 17}.py and never guess." for i in range(40))
FIRST = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Which file holds rule 7?"}]


def chat(stack: Stack, key: str, messages: list[dict]) -> dict:
    r = httpx.post(stack.base_url + "/v1/chat/completions", timeout=300, headers={"Authorization": f"Bearer {key}"},
                   json={"model": "default", "messages": messages, "max_tokens": 10, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def disk(stack: Stack) -> dict | None:
    """The disk tier's figures as the engine reports them (/health shows them only to an operator here)."""
    info = stack.probe()
    if info is None:
        return None
    return {k.removeprefix("prompt_cache_disk_"): v for k, v in info.items() if k.startswith("prompt_cache_disk_")}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(f"{KEY_A}\n{KEY_B}\n")
    s = Stack(extra={"API_KEYS_FILE": str(keys), "PROMPT_CACHE_BYTES": str(64 << 20)})
    s.engine, s.api = s.start_engine(), s.start_api()
    yield s
    s.api.stop()
    s.engine.stop()


def test_the_next_turn_after_restart_engine_restores_its_prefix_from_disk_and_answers_the_same(stack):
    wait_for(lambda: (d := disk(stack)) and d["cap_bytes"] > 0, 60, "the disk tier to open")
    one = chat(stack, KEY_A, FIRST)
    wait_for(lambda: disk(stack)["entries"] >= 1, 30, "turn one's entry on disk")
    stack.engine.stop()
    stack.engine = stack.start_engine()  # same PROMPT_CACHE_DIR: what `./launch.sh restart-engine` does
    wait_for(lambda: (d := disk(stack)) and d["cap_bytes"] > 0, 60, "the restarted engine's disk tier")
    turn = FIRST + [{"role": "assistant", "content": one["choices"][0]["message"]["content"]},
                    {"role": "user", "content": "And rule 8?"}]
    two = chat(stack, KEY_A, turn)
    assert two["usage"]["prompt_tokens_details"]["cached_tokens"] >= one["usage"]["prompt_tokens"] - 8
    # the same turn from another tenant: nothing of tenant A's is offered, so it is computed whole (the cache-off answer)
    other = chat(stack, KEY_B, turn)
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert two["choices"][0]["message"]["content"] == other["choices"][0]["message"]["content"]
    after = disk(stack)
    assert (after["restores"], after["restore_failures"]) == (1, 0) and after["hits"] == 1
