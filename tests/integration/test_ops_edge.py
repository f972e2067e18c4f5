"""launch.sh operations that must not lose anything: restart-api under open streams, with a refused
setting, or over a frozen API; a killed supervisor; start with only half of the service up; pid files
that name someone else's processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading

import httpx

from tests.harness import http_status
from tests.launch_stack import Launch, gone, live_processes, wait_for

HAND_OVERS = 6
KEPT_ALIVE_CLIENTS = 12
LONG = {"max_tokens": 4000, "logit_bias": {"0": -100, "2": -100}}  # no EOS: runs to max_tokens (~20 s here)


@contextlib.contextmanager
def running(**settings: str):
    """launch.sh start with these settings; launch.sh stop when the test ends, whatever it asserted."""
    launch = Launch(**settings)
    launch.start()
    try:
        yield launch
    finally:
        launch.stop()


def assert_old_api_serves(launch: Launch, old_api: int) -> None:
    """A restart-api that could not hand over left the old API in place, answering."""
    assert launch.group("api") == old_api and not gone([old_api])
    assert http_status(launch.url + "/health") == 200


def engine_active(launch: Launch) -> int:
    r = launch.run("status", timeout=60)
    for line in r.stdout.splitlines():
        if line.strip().startswith("requests"):
            return int(line.split()[1])
    return -1


@contextlib.contextmanager
def one_stream(launch: Launch):
    """A long chat stream past its first chunk: yields its line iterator."""
    with httpx.Client(timeout=httpx.Timeout(30, read=60)) as http:
        body = {"model": "default", "messages": [{"role": "user", "content": "a long story"}], "stream": True, **LONG}
        with http.stream("POST", launch.url + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            yield lines


def test_restart_api_hands_over_without_cutting_open_streams():
    with running(API_DRAIN_TIMEOUT="300") as launch:
        old_api = launch.group("api")
        with one_stream(launch) as lines:
            r = launch.run("restart-api", timeout=120)
            assert r.returncode == 0, r.stdout + r.stderr
            new_api = launch.group("api")
            launch.groups.add(new_api)
            assert new_api != old_api
            # The new API serves at once, while the old one still streams to its client.
            assert engine_active(launch) == 1
            assert not gone([old_api])
            reply = httpx.post(launch.url + "/v1/completions", timeout=30,
                               json={"model": "default", "prompt": "hi", "max_tokens": 3})
            assert reply.status_code == 200
            rest = [line for line in lines if line]
        # The stream ran to its end: no error, a finish_reason, then [DONE].
        assert rest[-1] == "data: [DONE]"
        assert not any('"error"' in line for line in rest)
        chunks = [json.loads(line.removeprefix("data: ")) for line in rest[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        # With nothing left open, the old API exits without waiting out its API_DRAIN_TIMEOUT of 300 s.
        wait_for(lambda: gone([old_api]), 15, "the replaced API to exit once its stream ended")

        # Nothing open: the replaced API exits at once, and stop leaves nothing behind.
        r = launch.run("restart-api", timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        previous, newest = new_api, launch.group("api")
        launch.groups.add(newest)
        wait_for(lambda: gone([previous]), 15, "an idle replaced API to exit")
        assert http_status(launch.url + "/health") == 200


def _kept_alive_client(url: str, i: int, stop: threading.Event, outcomes: list) -> None:
    """Requests back to back on one kept-alive connection (a new one only once the server closes it): small
    streamed completions, or /v1/models, which the API answers by itself in a moment."""
    body = {"model": "default", "prompt": "hi", "max_tokens": 8, "stream": True}
    with httpx.Client(base_url=url, timeout=30, limits=httpx.Limits(max_connections=1)) as http:
        while not stop.is_set():
            try:
                r = http.post("/v1/completions", json=body) if i % 2 else http.get("/v1/models")
                outcomes.append(True if r.status_code == 200 else f"{r.status_code} {r.text[:200]}")
            except httpx.HTTPError as exc:
                outcomes.append(f"{type(exc).__name__}: {exc!r}")


def test_restart_api_answers_every_request_that_arrives_on_a_kept_alive_connection():
    # A request sent on an idle kept-alive connection just as the replaced API starts draining reaches it:
    # it is answered (with Connection: close), never cut by a silent close or a reset.
    launch = Launch()
    launch.start()
    stop, outcomes = threading.Event(), []
    clients = [threading.Thread(target=_kept_alive_client, args=(launch.url, i, stop, outcomes), daemon=True)
               for i in range(KEPT_ALIVE_CLIENTS)]
    try:
        for t in clients:
            t.start()
        apis = [launch.group("api")]
        for _ in range(HAND_OVERS):
            seen = len(outcomes)
            wait_for(lambda: len(outcomes) >= seen + 4 * KEPT_ALIVE_CLIENTS, 60, "the clients to send requests")
            r = launch.run("restart-api", timeout=120)
            assert r.returncode == 0, r.stdout + r.stderr
            apis.append(launch.group("api"))
            launch.groups.add(apis[-1])
        seen = len(outcomes)
        wait_for(lambda: len(outcomes) >= seen + 4 * KEPT_ALIVE_CLIENTS, 60, "the clients to send requests")
        stop.set()
        for t in clients:
            t.join(60)
        assert not any(t.is_alive() for t in clients)
        failed = [o for o in outcomes if o is not True]
        assert not failed, f"{len(failed)} of {len(outcomes)} requests failed over {HAND_OVERS} hand-overs: {failed[:5]}"
        assert len(set(apis)) == HAND_OVERS + 1
        wait_for(lambda: gone(apis[:-1]), 30, "the replaced APIs to exit")
    finally:
        stop.set()
        launch.stop()


def test_restart_api_ends_streams_past_the_drain_timeout_with_an_error_event_then_done():
    with running(API_DRAIN_TIMEOUT="2") as launch:
        old_api = launch.group("api")
        with one_stream(launch) as lines:
            r = launch.run("restart-api", timeout=120)
            assert r.returncode == 0, r.stdout + r.stderr
            launch.groups.add(launch.group("api"))
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"
        error = json.loads(rest[-2].removeprefix("data: "))["error"]
        assert error["code"] == "shutting_down" and "API_DRAIN_TIMEOUT=2 s" in error["message"], error
        wait_for(lambda: gone([old_api]), 15, "the replaced API to exit")
        # The engine freed the ended stream's sequence; the new API serves.
        wait_for(lambda: engine_active(launch) == 0, 15, "the engine to free the ended stream")
        assert http_status(launch.url + "/health") == 200


def test_a_killed_supervisor_is_noticed_and_start_brings_the_engine_back_under_the_running_api():
    with running(ENGINE_RESTART="always", DRAIN_TIMEOUT="2") as launch:
        supervisor, api = launch.group("engine"), launch.group("api")
        ranks = set(launch.rank_pids().values())
        os.kill(supervisor, signal.SIGKILL)

        # Whether the ranks still run (unsupervised) or have ended already, status says so and fails.
        r = launch.run("status", timeout=60)
        assert r.returncode == 1, r.stdout
        assert f"supervisor (pid {supervisor})" in r.stdout and "./launch.sh" in r.stdout, r.stdout

        # Rank 0 notices and stops the engine: no engine runs on without its supervisor.
        wait_for(lambda: gone(ranks), 30, "the ranks to end after their supervisor was killed")
        assert not [pid for pid, group in live_processes().items() if group == supervisor]
        r = launch.run("status", timeout=60)
        assert r.returncode == 1
        assert f"DEAD: its supervisor (pid {supervisor}) was killed" in r.stdout and "./launch.sh start" in r.stdout

        # start with a dead engine and a live API: it starts the engine, the API stays.
        r = launch.run("start", timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "starting the engine" in r.stderr
        launch.groups.add(launch.group("engine"))
        assert launch.group("api") == api and launch.group("engine") != supervisor
        wait_for(lambda: http_status(launch.url + "/health") == 200, 30, "/health 200 with the new engine")
        reply = httpx.post(launch.url + "/v1/completions", timeout=30,
                           json={"model": "default", "prompt": "hi", "max_tokens": 3})
        assert reply.status_code == 200

        r = launch.run("start", timeout=60)  # everything up: refused, nothing changed
        assert r.returncode == 1 and "already running" in r.stderr
        assert launch.run("status", timeout=60).returncode == 0


def test_restart_api_with_a_setting_the_api_refuses_keeps_the_old_api_serving():
    with running() as launch:
        old_api = launch.group("api")
        r = launch.run("restart-api", timeout=120, API_KEYS_FILE="/nonexistent/keys")
        assert r.returncode == 2, r.stdout + r.stderr
        assert "API_KEYS_FILE" in r.stderr and f"(process group {old_api}) keeps serving" in r.stderr
        assert_old_api_serves(launch, old_api)
        assert launch.run("status", timeout=60).returncode == 0


def test_restart_api_to_a_port_another_program_holds_keeps_the_old_api_serving():
    with running() as launch:
        old_api = launch.group("api")
        with socket.socket() as holder:  # another program on the new API_PORT: "Address already in use"
            holder.bind(("127.0.0.1", 0))
            holder.listen()
            r = launch.run("restart-api", timeout=120, API_PORT=str(holder.getsockname()[1]))
        assert r.returncode == 1, r.stdout + r.stderr
        assert "Address already in use" in r.stderr and "keeps serving" in r.stderr
        assert_old_api_serves(launch, old_api)
        assert not list((launch.root / "run").glob("api.draining.*"))


def test_a_frozen_replaced_api_is_killed_without_waiting_for_its_deadline():
    with running(API_DRAIN_TIMEOUT="1") as launch:
        old_api = launch.group("api")
        os.killpg(old_api, signal.SIGSTOP)  # frozen: it could never act on the TERM of the hand-over
        r = launch.run("restart-api", timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        launch.groups.add(launch.group("api"))
        assert launch.group("api") != old_api
        # KILLed by the watcher once it has looked stopped a few times, off the port, its draining file removed
        wait_for(lambda: gone([old_api]) and not list((launch.root / "run").glob("api.draining.*")), 30,
                 "the frozen replaced API to be killed and its file removed")
        r = launch.run("status", timeout=60)
        assert r.returncode == 0 and "previous API" not in r.stdout, r.stdout
        assert http_status(launch.url + "/health") == 200


def test_pid_files_and_a_lock_naming_unrelated_processes_are_stale_and_never_signalled():
    launch = Launch()
    run = launch.root / "run"
    run.mkdir()
    strangers = [subprocess.Popen(["sleep", "1000"], start_new_session=True) for _ in range(3)]
    try:
        for stranger, name in zip(strangers, ("api.pid", "engine.pid", "launch.lock")):
            (run / name).write_text(f"{stranger.pid}\n")
        r = launch.run("status", timeout=60)
        assert r.returncode == 3, r.stdout + r.stderr  # all stopped: nothing of ours runs
        assert "stale pid file" in r.stdout and "running" not in r.stdout, r.stdout
        (run / "api.pid").write_text(f"{strangers[0].pid}\n")
        launch.start()  # neither "already running" nor "another ./launch.sh is changing the services"
        assert launch.group("api") != strangers[0].pid
        launch.stop()
        assert all(s.poll() is None for s in strangers), "an unrelated process was signalled"
    finally:
        for s in strangers:
            s.kill()
            s.wait(10)
