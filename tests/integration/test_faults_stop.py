"""`launch.sh stop` during traffic (and itself sent SIGTERM): every in-flight request finishes or
ends with an error event within DRAIN_TIMEOUT, new ones get 503, and no process is left."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import signal
import subprocess
import threading
import time

import httpx

from tests.harness import REPO
from tests.launch_stack import Launch, live_processes, wait_for

DRAIN = 3.0
LONG = {"max_tokens": 4000, "logit_bias": {"0": -100, "2": -100}}


def finish(proc: subprocess.Popen, timeout: float) -> None:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    finally:
        if proc.stdout is not None:
            proc.stdout.close()


def short_requests(url: str, stop: threading.Event) -> list[int | str]:
    """Short requests one after another until told to stop: their statuses (or 'refused')."""
    out: list[int | str] = []
    deadline = time.monotonic() + 60
    with httpx.Client(timeout=30) as http:
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                r = http.post(url + "/v1/completions", json={"model": "default", "prompt": "hi", "max_tokens": 3})
            except httpx.TransportError:
                out.append("refused")
                time.sleep(0.05)
                continue
            out.append(r.status_code)
            if r.status_code == 503:
                assert int(r.headers["Retry-After"]) >= 1
    return out


def test_stop_during_traffic_drains_in_flight_requests_and_leaves_no_process():
    launch = Launch(DRAIN_TIMEOUT=str(DRAIN))
    launch.start()
    groups = {launch.group("engine"), launch.group("api")}
    try:
        stop_shorts = threading.Event()
        with cf.ThreadPoolExecutor(2) as pool, contextlib.ExitStack() as stack:
            stack.callback(stop_shorts.set)  # however this block ends, the short clients stop (before the pool waits)
            http = stack.enter_context(httpx.Client(timeout=httpx.Timeout(10, read=DRAIN + 10)))
            streams = []
            for i in range(3):
                body = {"model": "default", "messages": [{"role": "user", "content": f"story {i}"}], "stream": True,
                        **LONG}
                r = stack.enter_context(http.stream("POST", launch.url + "/v1/chat/completions", json=body))
                lines = r.iter_lines()
                assert next(lines).startswith("data: ")
                streams.append(lines)
            shorts = [pool.submit(short_requests, launch.url, stop_shorts) for _ in range(2)]

            stopping = subprocess.Popen([str(REPO / "launch.sh"), "stop"], env=launch.env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            # However this block ends, the stop finishes (launch.stop() below would find it holding
            # launch.sh's lock) and its pipe closes (or a later test fails on the ResourceWarning).
            stack.callback(finish, stopping, DRAIN + 30)
            t0 = time.monotonic()
            # The stop itself gets SIGTERM once it is under way: it must still finish its job.
            wait_for(lambda: "stopping the engine" in launch.log_tail(5), 10, "the engine to begin its drain")
            stopping.send_signal(signal.SIGTERM)
            for lines in streams:
                rest = [line for line in lines if line]
                assert time.monotonic() - t0 < DRAIN + 3, "a stream outlived the drain deadline"
                assert rest[-1] == "data: [DONE]"
                error = json.loads(rest[-2].removeprefix("data: "))["error"]
                assert error["code"] == "shutting_down", error
            output, _ = stopping.communicate(timeout=DRAIN + 30)
            stop_shorts.set()
            statuses = [s for f in shorts for s in f.result(timeout=60)]
        assert stopping.returncode == 0, output
        assert "interrupted" in output, output
        # Short requests finished (200) or were refused as documented (503 + Retry-After), then
        # found nothing listening: never a 500, never a hang.
        assert 200 in statuses and set(statuses) <= {200, 503, "refused"}, (statuses, launch.log_tail(60, "api"))
        assert not [pid for pid, group in live_processes().items() if group in groups]
        assert not (launch.root / "run" / "engine.sock").exists()
    finally:
        launch.stop()
