"""A frozen rank (SIGSTOP) turns /health to 503 "stalled" within the deadline; SIGCONT brings 200 back."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from tests.harness import Stack, wait_for

pytestmark = pytest.mark.multirank

STALL_SECONDS = 3.0
# /health waits up to 2 s for Info; a probe may start just before the deadline passes.
SLACK = 3.0


def test_sigstop_rank1_turns_health_503_and_sigcont_recovers():
    s = Stack()
    # a high watchdog, so the engine outlives the freeze instead of ending itself
    engine = s.start_engine(ranks=2, WATCHDOG_TIMEOUT="300", HEALTH_STALL_SECONDS=str(STALL_SECONDS))
    api = s.start_api(HEALTH_STALL_SECONDS=str(STALL_SECONDS))
    stopped: int | None = None
    try:
        get = lambda path: httpx.get(s.base_url + path, timeout=15)  # noqa: E731
        wait_for(lambda: len(get("/health").json().get("rank_states") or []) >= 2, 30, "both ranks' first reports")
        r = get("/health")
        assert r.status_code == 200, r.text
        rank1 = next(rank for rank in r.json()["rank_states"] if rank["rank"] == 1)
        assert rank1["pid"] != r.json()["engine_pid"]

        os.kill(rank1["pid"], signal.SIGSTOP)
        stopped = frozen_at = time.monotonic()
        r = wait_for(lambda: (lambda r: r if r.status_code != 200 else None)(get("/health")), STALL_SECONDS + SLACK,
                     "/health to stop answering 200 once rank 1 is frozen")
        took = time.monotonic() - frozen_at
        assert r.status_code == 503, (took, r.text)
        body = r.json()
        assert body["status"] == "unavailable" and body["api"] == "ok"
        assert body["engine"].startswith("stalled: "), body
        # the rest of the API still answers: the model list comes from the engine's socket thread or the cache
        assert get("/v1/models").status_code == 200

        os.kill(rank1["pid"], signal.SIGCONT)
        stopped = None
        r = wait_for(lambda: (lambda r: r if r.status_code == 200 else None)(get("/health")), 15,
                     "/health to answer 200 again once rank 1 runs")
        assert r.json()["engine"] == "ok"
        assert engine.alive()
    finally:
        if stopped is not None:
            os.kill(rank1["pid"], signal.SIGCONT)  # never leave a stopped process behind
        api.stop()
        engine.stop()
