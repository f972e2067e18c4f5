"""A rank killed or frozen: the whole engine ends, `launch.sh status` names the rank, and with
ENGINE_RESTART=always the engine comes back by itself. Two real ranks over the ring backend,
started the way users start them: through launch.sh (and so through ops/supervisor.py).
"""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from tests.launch_stack import Launch, gone, live_processes, wait_for

pytestmark = pytest.mark.multirank

WATCHDOG = 5.0  # WATCHDOG_TIMEOUT for these tests (default 30 s)
TWO_RANKS = "127.0.0.1,127.0.0.1"
LONG = {"model": "default", "messages": [{"role": "user", "content": "go on"}], "max_tokens": 4000,
        "stream": True, "logit_bias": {"0": -100, "2": -100}}


def end_of_stream(lines) -> list[str]:
    return [line for line in lines if line]


def test_a_frozen_rank_ends_every_rank_and_status_names_it():
    launch = Launch(HOSTS=TWO_RANKS, WATCHDOG_TIMEOUT=str(WATCHDOG))  # ENGINE_RESTART=never (the default)
    try:
        launch.start()
        ranks = launch.rank_pids()
        engine_processes = {pid for pid, group in live_processes().items() if group == launch.group("engine")}
        assert set(ranks.values()) <= engine_processes and len(ranks) == 2
        with httpx.Client(timeout=httpx.Timeout(10, read=WATCHDOG + 10)) as http, \
                http.stream("POST", launch.url + "/v1/chat/completions", json=LONG) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            os.kill(ranks[1], signal.SIGSTOP)
            frozen = time.monotonic()
            rest = end_of_stream(lines)
        # The open stream ended with an error event once rank 0's watchdog gave up.
        assert rest[-1] == "data: [DONE]" and '"error"' in rest[-2]
        assert time.monotonic() - frozen < WATCHDOG + 5

        wait_for(lambda: gone(engine_processes), WATCHDOG + 10, "every engine process to end")
        ended = time.monotonic() - frozen
        print(f"every engine process ended {ended:.1f} s after the freeze")
        assert ended < WATCHDOG + 6, f"the engine took {ended:.1f} s to end"

        status = launch.run("status")
        assert status.returncode == 1
        assert "DEAD" in status.stdout and "rank 1" in status.stdout, status.stdout
        assert "stopped responding" in status.stdout and "(its process is stopped)" in status.stdout, status.stdout
        r = httpx.post(launch.url + "/v1/chat/completions", timeout=10, json={**LONG, "stream": False})
        assert r.status_code == 503 and "Retry-After" in r.headers
    finally:
        launch.stop()


def test_a_killed_rank_is_named_and_the_engine_restarts_by_itself():
    launch = Launch(HOSTS=TWO_RANKS, WATCHDOG_TIMEOUT=str(WATCHDOG), ENGINE_RESTART="always")
    try:
        launch.start()
        ranks = launch.rank_pids()
        old_engine_pid = launch.state()["engine_pid"]
        os.kill(ranks[1], signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: gone(ranks.values()), WATCHDOG, "both old ranks to end")
        print(f"old ranks gone {time.monotonic() - killed:.1f} s after the kill")

        def serving_again():
            s = launch.state()
            return s["state"] == "running" and s["engine_pid"] not in (0, old_engine_pid) and s

        state = wait_for(serving_again, 60, "the engine to be restarted")
        assert state["restarts"] == 1 and len(state["ranks"]) == 2
        assert state["last_failure"]["rank"] == 1
        status = launch.run("status")
        assert status.returncode == 0, status.stdout
        assert "last failure" in status.stdout and "rank 1" in status.stdout and "SIGKILL" in status.stdout
        assert "restarts      1" in status.stdout
        # The API reconnected by itself: a request works without touching it.
        r = httpx.post(launch.url + "/v1/chat/completions", timeout=30, json={**LONG, "stream": False, "max_tokens": 5})
        assert r.status_code == 200, r.text
    finally:
        launch.stop()
