"""KV memory on two tensor-parallel ranks: each rank measures its own shard's caches, MLA's latent is held
whole on every rank, and the estimate rank 0 budgets with covers what each rank's caches really hold after a
prefill, within 1.25x, for MLA (DeepSeek-V3) and a linear-attention hybrid (Qwen3.5)."""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest

from engine.rank0.kv_budget import KVBudget, KVMemory
from tests.harness import MLX_LAUNCH, PYTHON, REPO, Stack, short_dir, wait_for

pytestmark = pytest.mark.multirank

TOKENS = 300


def sharded_caches(stack: Stack) -> list[dict]:
    """What each of two ranks (mlx-lm's sharded load, as the engine loads) measures and really holds."""
    out = short_dir("kvr-")
    env = stack.env()
    cmd = [MLX_LAUNCH, "--hosts", "127.0.0.1,127.0.0.1", "--backend", "ring", "--starting-port", env["RING_PORT"],
           "--cwd", str(REPO), "--", PYTHON, "-m", "tests.multirank.kv_ranks", str(out), str(TOKENS)]
    r = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    files = [out / f"rank{i}.json" for i in range(2)]
    assert all(f.exists() for f in files), r.stdout[-2000:] + r.stderr[-2000:]
    return [json.loads(f.read_text()) for f in files]


@pytest.mark.parametrize("name, latent", [("deepseek-v3", True), ("qwen3.5", False)])
def test_the_engine_budgets_each_rank_with_what_its_shard_holds(name: str, latent: bool):
    stack = Stack(extra={"MODEL": "zoo-" + name, "PROMPT_CACHE_BYTES": "0", "KV_MEMORY_BYTES": str(64 << 20)})
    ranks = sharded_caches(stack)
    engine = stack.start_engine(ranks=2)
    try:
        api = stack.start_api()
        try:
            health = httpx.get(stack.base_url + "/health", timeout=10).json()["kv_memory"]
        finally:
            api.stop()
    finally:
        engine.stop()
    measured = [KVMemory.from_row(r["memory"]) for r in ranks]
    largest = KVMemory.largest(measured)
    assert health["measured"] and (health["token_bytes"], health["window_token_bytes"], health["window_tokens"],
                                   health["constant_bytes"]) == (largest.token_bytes, largest.window_token_bytes,
                                                                 largest.window, largest.constant_bytes)
    estimate = KVBudget.of(64 << 20, largest, 512).sequence(TOKENS, 0)
    for r in ranks:
        assert r["real"] <= estimate <= 1.25 * r["real"], (name, measured, r["real"], estimate)
    if latent:  # MLA's latent is not divided by tensor parallelism: each rank holds all of it
        assert largest.token_bytes == 2 * (64 + 16) * 4
    else:  # a hybrid's KV heads and linear-attention heads are divided between the ranks
        assert largest.token_bytes == 512 // 2 and largest.constant_bytes < 33792


def test_a_two_rank_mla_prefix_cache_entry_holds_no_more_than_its_estimate():
    """Through the real engine: an MLA prompt's KV kept by the prefix cache, as MLX measures it on each rank."""
    stack = Stack(extra={"MODEL": "zoo-deepseek-v3", "PROMPT_CACHE_BYTES": str(64 << 20)})
    engine = stack.start_engine(ranks=2)
    try:
        api = stack.start_api()
        try:
            r = httpx.post(stack.base_url + "/v1/completions", timeout=120, json={
                "model": "default", "prompt": " ".join(f"w{i}" for i in range(160)), "max_tokens": 1,
                "temperature": 0})
            assert r.status_code == 200, r.text
            fed = r.json()["usage"]["prompt_tokens"]
            info = wait_for(lambda: (i := stack.probe()) and all(s["prompt_cache_bytes"] for s in i["rank_states"])
                            and i, 30, "every rank to report its prefix cache bytes")
        finally:
            api.stop()
    finally:
        engine.stop()
    kv = KVBudget.of(info["kv_budget_bytes"], KVMemory(info["kv_token_bytes"], info["kv_window_token_bytes"],
                                                       info["kv_window"], info["kv_constant_bytes"]), 512)
    held = [s["prompt_cache_bytes"] for s in info["rank_states"]]  # MLX's nbytes, reported in KiB
    assert info["kv_token_bytes"] == 2 * (64 + 16) * 4  # the whole latent on each of the two ranks
    assert all(h <= kv.sequence(fed, 0) <= 1.25 * h for h in held), (fed, held, kv.sequence(fed, 0))
