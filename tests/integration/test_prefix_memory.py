"""The prefix cache holds the memory it reports: after a burst of concurrent requests, each rank's MLX active
memory grows by what that rank says its prefix cache entries take, not by the batch buffers they were cut from.

An entry extracted from the batch is a slice of the whole batch's buffer until it is copied; kept lazily, each
entry pinned every row's KV while counting only its own.
"""

from __future__ import annotations

import concurrent.futures as cf
import random
import time

import httpx
import pytest

from tests.harness import Stack, wait_for

BURST = 32
PROMPT_TOKENS = 1930
# the demo model's EOS ids are banned, so every request runs to its own max_tokens
NO_EOS = {"0": -100, "2": -100}
# what else may stay allocated between two idle moments (logits, samplers' small arrays, MLX bookkeeping)
SLACK = 4 << 20


def idle_states(stack: Stack) -> list[dict]:
    """Every rank's report once the engine is idle: two reports in a row from every rank, both taken after the API
    saw no request running or queued, that agree. (A report taken in the plan storing the last entries, after the
    last request ended, says what was held for those stores, not what the engine keeps.)"""
    idle_since = wait_for(lambda: (i := stack.probe()) and not i["active"] and not i["queued"] and time.monotonic(),
                          300, "the engine to be idle")
    last: dict = {"taken": None, "state": None}

    def two_alike():
        now = time.monotonic()
        info = stack.probe()
        if not info:
            return None
        taken = [now - r["report_age"] for r in info["rank_states"]]
        if min(taken) <= idle_since:
            return None
        if last["taken"] is not None and any(t <= was + 0.5 for t, was in zip(taken, last["taken"])):
            return None  # not yet a newer report from every rank
        state = [{k: r[k] for k in ("rank", "step", "active_memory", "prompt_cache_bytes")} for r in info["rank_states"]]
        if state == last["state"]:
            return state
        last.update(taken=taken, state=state)
        return None
    return wait_for(two_alike, 60, "two rank reports in a row that agree")


@pytest.mark.parametrize(("model", "ranks"), [
    # plain KV on two ranks: rank 0 goes through the same code as a lone rank would (a demo-tiny on one rank
    # was a twin of it: 45 s more of CI for no other path), and rank 1 holds what it reports too
    pytest.param("demo-tiny", 2, marks=pytest.mark.multirank),
    # entries of every cache kind: linear-attention states kept at prompts' ends, sliding windows that wrapped
    ("zoo-qwen3.5", 1), ("zoo-gpt-oss", 1)])
def test_after_a_concurrent_burst_each_rank_holds_what_it_reports(model, ranks):
    stack = Stack(extra={"KV_MEMORY_BYTES": str(64 << 20), "MODEL": model})
    engine = stack.start_engine(ranks=ranks)
    api = stack.start_api()
    try:
        rng = random.Random(23)
        prompts = [[rng.randrange(3, 1000) for _ in range(PROMPT_TOKENS)] for _ in range(BURST)]
        before = idle_states(stack)

        def complete(i: int) -> None:
            r = httpx.post(stack.base_url + "/v1/completions", timeout=600, json={
                "model": "default", "prompt": prompts[i], "max_tokens": 10 + i * 15, "temperature": 0,
                "logit_bias": NO_EOS})
            assert r.status_code == 200, r.text

        with cf.ThreadPoolExecutor(BURST) as pool:
            list(pool.map(complete, range(BURST)))
        after = idle_states(stack)
        for was, now in zip(before, after):
            grew = now["active_memory"] - was["active_memory"]
            held = now["prompt_cache_bytes"] - was["prompt_cache_bytes"]
            assert held > 8 << 20, f"rank {now['rank']}: the burst left only {held} bytes of prefix cache"
            assert grew <= held + SLACK, (
                f"rank {now['rank']}: MLX active memory grew by {grew >> 20} MiB over the burst, while the prefix "
                f"cache reports {held >> 20} MiB")
    finally:
        api.stop()
        engine.stop()
