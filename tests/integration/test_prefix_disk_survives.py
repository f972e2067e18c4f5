"""The prefix cache's disk tier outlives every way the engine ends, started as users start it (launch.sh, and so the
supervisor): a crash the supervisor restarts, `stop` then `start`, a `switch` to another model and back. Each time the
next turn of a conversation restores what the turn before computed (cached_tokens) and answers exactly as computing
it whole does. `restart-engine` is tests/integration/test_prefix_disk.py's."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import httpx
import pytest

from engine.diskcache.tier import SUFFIX
from tests.integration.test_prefix_disk import chat, disk
from tests.launch_stack import Launch, gone, wait_for

KEY_A, KEY_B = "sk-survive-tenant-a-01", "sk-survive-tenant-b-02"


def system(topic: str) -> str:
    """A long system prompt of each test's own: no test restores another's entry."""
    return " ".join(f"Rule {i} of {topic}: keep the answer short, cite file {i % 17}.py and never guess."
                    for i in range(40))


def tier_open(launch: Launch) -> dict:
    return wait_for(lambda: (d := disk(launch.url)) and d["cap_bytes"] > 0 and d, 120, "the disk tier to open")


def written(launch: Launch, key: str, messages: list[dict]) -> dict:
    """One turn, once its entry is on disk (rank 0 wrote it)."""
    before = tier_open(launch)["writes"]
    answer = chat(launch.url, key, messages)
    wait_for(lambda: (d := disk(launch.url)) and d["writes"] > before, 30, "the turn's entry on disk")
    return answer


@pytest.fixture(scope="module")
def launch():
    launch = Launch(ENGINE_RESTART="always", PROMPT_CACHE_BYTES=str(64 << 20), PROMPT_CACHE_DISK_BYTES=str(256 << 20),
                    PROTECT_OPS_ROUTES="false")
    keys = launch.root / "keys.txt"
    keys.write_text(f"{KEY_A}\n{KEY_B}\n")
    # the same folder across every start, as a host's PROMPT_CACHE_DIR is
    launch.env.update(API_KEYS_FILE=str(keys), PROMPT_CACHE_DIR=str(launch.root / "prompt-cache"))
    launch.start()
    try:
        yield launch
    finally:
        launch.stop()


def survives(launch: Launch, topic: str, end: Callable[[], None]) -> None:
    """Turn one, end the engine the way `end` does, then turn two restores turn one's prefix from disk and answers as
    another tenant (who has no entry of it) computing it whole does."""
    first = [{"role": "system", "content": system(topic)}, {"role": "user", "content": "Which file holds rule 7?"}]
    one = written(launch, KEY_A, first)
    end()
    tier_open(launch)
    turn = first + [{"role": "assistant", "content": one["choices"][0]["message"]["content"]},
                    {"role": "user", "content": "And rule 8?"}]
    two = chat(launch.url, KEY_A, turn)
    assert two["usage"]["prompt_tokens_details"]["cached_tokens"] >= one["usage"]["prompt_tokens"] - 8, two["usage"]
    computed = chat(launch.url, KEY_B, turn)
    assert computed["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert two["choices"][0]["message"]["content"] == computed["choices"][0]["message"]["content"]
    # the engine's own figures: this restart restored once and failed none; both turns written before the next test
    # counts writes (one still under way would pass for its turn one's)
    after = wait_for(lambda: (d := disk(launch.url)) and d["writes"] >= 2 and d, 30, "both turns two on disk")
    assert (after["restores"], after["restore_failures"]) == (1, 0), after


def test_the_next_turn_after_a_crash_the_supervisor_restarts_restores_from_disk(launch):
    def crash() -> None:
        ranks, old = launch.rank_pids(), launch.state()
        os.kill(ranks[0], signal.SIGKILL)
        wait_for(lambda: gone(ranks.values()), 30, "the killed rank to end")
        wait_for(lambda: (s := launch.state())["state"] == "running" and s["engine_pid"] not in (0, old["engine_pid"]),
                 120, "the supervisor to restart the engine")
        assert launch.state()["restarts"] == old["restarts"] + 1

    survives(launch, "the crash", crash)


def test_the_next_turn_after_stop_and_start_restores_from_disk(launch):
    def stop_start() -> None:
        r = launch.run("stop", timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        launch.start()

    survives(launch, "the restart", stop_start)


def test_the_next_turn_after_a_switch_away_and_back_restores_from_disk(launch):
    def away_and_back() -> None:
        r = launch.run("switch", "zoo-qwen3", timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr + launch.log_tail()
        # the other model writes entries of its own into its own folder under the same PROMPT_CACHE_DIR
        written(launch, KEY_A, [{"role": "user", "content": "Something else entirely, for the other model."}])
        models = httpx.get(launch.url + "/v1/models", timeout=10, headers={"Authorization": f"Bearer {KEY_A}"})
        assert [m["id"] for m in models.json()["data"]] == ["zoo-qwen3"], models.text
        r = launch.run("switch", "demo-tiny", timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr + launch.log_tail()

    survives(launch, "the switch", away_and_back)
    # both models' entries are kept, each in a folder named by its weights: the switch back to either restores
    root = launch.root / "prompt-cache"
    assert len({p.relative_to(root).parts[0] for p in root.glob(f"*/*/*/*{SUFFIX}")}) == 2
