"""Pid files name our processes, not just live pids: a reused pid is stale and never signalled; a
replaced API that hangs past its drain deadline is killed; restart-api keeps the old API when the new
one's settings are refused; a HUP during start undoes it as a TERM does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from config import load_settings
from ops import commands, drain_watch
from ops.api_ctl import ApiCtl
from ops.commands import Interrupted, Services, _interruptible
from ops.layout import Die, Layout
from ops.pidfile import Lock, PidFile, Record, stop_recorded
from ops.procs import free_port, group_alive, poll, process_start
from ops.status import api_status, draining_status, status

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


@pytest.fixture
def layout(tmp_path) -> Layout:
    (tmp_path / "empty.env").touch()
    env = {"RUN_DIR": str(tmp_path / "run"), "LOG_DIR": str(tmp_path / "logs"), "API_HOST": "127.0.0.1",
           "API_PORT": str(free_port()), "SOCKET_PATH": str(tmp_path / "e.sock"), "API_DRAIN_TIMEOUT": "1"}
    layout = Layout(load_settings(env, tmp_path / "empty.env"))
    layout.prepare_dirs()
    return layout


@pytest.fixture
def spawn():
    """Processes in sessions of their own (as `setsid`), killed after the test."""
    started: list[subprocess.Popen] = []

    def start(*extra: str) -> int:
        p = subprocess.Popen([*SLEEPER, *extra], start_new_session=True, stdin=subprocess.DEVNULL)
        started.append(p)
        assert poll(lambda: process_start(p.pid), 10)
        return p.pid

    yield start
    for p in started:
        p.kill()
        p.wait(10)


@pytest.fixture
def signals(monkeypatch):
    """Every signal ops sends (but kill -0), recorded instead of sent."""
    sent: list[tuple[int, int]] = []
    real_kill, real_killpg = os.kill, os.killpg

    def kill(pid, sig):
        return real_kill(pid, 0) if sig == 0 else sent.append((pid, sig))

    def killpg(pid, sig):
        return real_killpg(pid, 0) if sig == 0 else sent.append((-pid, sig))

    monkeypatch.setattr(os, "kill", kill)
    monkeypatch.setattr(os, "killpg", killpg)
    return sent


def test_a_pid_file_naming_an_unrelated_process_is_stale_and_never_signalled(tmp_path, spawn, capsys):
    other = spawn()  # `setsid sleep` written into api.pid by hand: a live group, but not an API
    pids = PidFile(tmp_path / "api.pid")
    pids.path.write_text(f"{other}\n")
    assert pids.running() is None
    assert "another program" in pids.check()[1]
    stop_recorded("api", pids, 5)
    assert group_alive(other) and not pids.path.exists()
    assert "not signalling anything" in capsys.readouterr().err

    # The same pid recorded with another start time: a later process that got the pid.
    pids.save(Record(other, "another-start"))
    assert pids.clear_stale() is None and not pids.path.exists()
    assert "started at another time" in capsys.readouterr().err
    assert group_alive(other)


def test_a_pid_file_we_wrote_names_our_group_and_stop_ends_it(tmp_path, spawn):
    pid = spawn()
    pids = PidFile(tmp_path / "api.pid")
    pids.write(pid)
    assert pids.record().start == process_start(pid)
    assert pids.running() == pid
    stop_recorded("api", pids, 5)
    assert poll(lambda: not group_alive(pid), 10) and not pids.path.exists()


def test_a_pid_file_from_an_older_launch_sh_is_trusted_when_its_process_runs_the_api(tmp_path, spawn):
    pid = spawn("-m", "api")  # the API's command line: `python ... -m api`
    pids = PidFile(tmp_path / "api.pid")
    pids.path.write_text(f"{pid}\n")
    assert pids.running() == pid
    (tmp_path / "engine.pid").write_text(f"{pid}\n")
    assert PidFile(tmp_path / "engine.pid").running() is None  # an API is not the engine


@pytest.mark.parametrize("text", ["0", "1", f"{os.getpgrp()}"])
def test_pids_0_and_1_and_our_own_group_are_never_signalled(tmp_path, signals, text):
    pids = PidFile(tmp_path / "api.pid")
    pids.path.write_text(f"{text}\n")
    assert pids.running() is None
    stop_recorded("api", pids, 1)
    assert signals == [] and not pids.path.exists()


def test_a_lock_held_by_an_unrelated_process_is_stale_and_a_live_launch_sh_is_busy(tmp_path, spawn, layout, capsys):
    path = tmp_path / "launch.lock"
    other = spawn()
    path.write_text(f"{other}\n")  # a pid file format without a start time: judged by what it runs
    lock = Lock(path)
    lock.acquire()
    assert "removing stale lock" in capsys.readouterr().err and PidFile(path).read() == os.getpid()
    lock.release()

    # A lock holder recorded with its start time is busy, whatever it runs; the message says what to do.
    PidFile(layout.run_dir / "launch.lock").write(other)
    with pytest.raises(Die) as died:
        Services(layout).stop()
    assert f"pid {other}" in str(died.value) and f"remove {layout.run_dir / 'launch.lock'}" in str(died.value)


def test_status_and_start_see_through_a_stale_api_pid_file(layout, spawn, capsys):
    other = spawn()
    layout.api_pid.write_text(f"{other}\n")
    state, lines = api_status(layout, ApiCtl(layout))
    assert state == "stopped" and "stale pid file" in "\n".join(lines)
    assert not layout.api_pid.exists()
    layout.api_pid.write_text(f"{other}\n")
    assert status(layout) == 3  # all stopped
    api = ApiCtl(layout)
    api.refuse_running()  # nothing of ours runs: no "already running"
    assert group_alive(other)


def test_restart_api_refuses_a_setting_the_api_would_refuse_and_keeps_the_old_one(tmp_path, spawn, monkeypatch):
    (tmp_path / "empty.env").touch()
    settings = load_settings({"RUN_DIR": str(tmp_path / "run"), "LOG_DIR": str(tmp_path / "logs"),
                              "API_PORT": str(free_port()), "SOCKET_PATH": str(tmp_path / "e.sock"),
                              "API_KEYS_FILE": "/nonexistent/keys"}, tmp_path / "empty.env")
    layout = Layout(settings)
    layout.prepare_dirs()
    old = spawn("-m", "api")
    PidFile(layout.api_pid).write(old)
    before = layout.api_pid.read_text()

    def never(*args, **kw):
        raise AssertionError("nothing may be stopped or started")

    for name in ("hand_over", "stop", "launch", "start"):
        monkeypatch.setattr(ApiCtl, name, never)
    with pytest.raises(Die) as died:
        Services(layout).restart_api()
    assert died.value.code == 2 and f"process group {old}) keeps serving" in str(died.value)
    assert layout.api_pid.read_text() == before and group_alive(old)


def test_restart_api_keeps_the_old_api_when_the_new_one_fails(layout, spawn, monkeypatch, capsys):
    old = spawn("-m", "api")
    PidFile(layout.api_pid).write(old)
    monkeypatch.setattr(ApiCtl, "hand_over", lambda self, pid: "failed")
    monkeypatch.setattr(ApiCtl, "stop", lambda self, quiet=False: pytest.fail("the old API was stopped"))
    monkeypatch.setattr(commands.EngineCtl, "info", lambda self: None)
    assert Services(layout).restart_api() == 1
    assert "keeps serving" in capsys.readouterr().err and group_alive(old)


def draining(layout: Layout, pid: int, since: float) -> PidFile:
    pids = PidFile(layout.run_dir / f"api.draining.{pid}")
    pids.save(Record(pid, process_start(pid), since))
    return pids


def test_a_replaced_api_hung_past_its_drain_deadline_is_reported_and_killed(layout, spawn, capsys):
    hung = spawn("-m", "api")
    os.killpg(hung, signal.SIGSTOP)
    pids = draining(layout, hung, time.time() - 60)  # API_DRAIN_TIMEOUT=1: long overdue
    fine, lines = draining_status(layout, ApiCtl(layout))
    assert not fine and "STILL RUNS" in "\n".join(lines)
    assert status(layout) == 1  # not "all stopped": something of ours runs where it should not

    fresh = spawn("-m", "api")
    draining(layout, fresh, time.time())  # within its deadline: left to drain
    ApiCtl(layout).reap_drained()
    assert poll(lambda: not group_alive(hung), 10) and not pids.path.exists()
    assert group_alive(fresh) and draining_status(layout, ApiCtl(layout))[0]
    assert "hung or frozen; killing it" in capsys.readouterr().err


def test_the_drain_watcher_kills_a_frozen_replaced_api_at_its_deadline(layout, spawn):
    hung = spawn("-m", "api")
    os.killpg(hung, signal.SIGSTOP)
    pids = draining(layout, hung, time.time())
    t0 = time.monotonic()
    assert drain_watch.watch(pids.path, 1.5) == 0
    assert 1.0 <= time.monotonic() - t0 < 10
    assert poll(lambda: not group_alive(hung), 10) and not pids.path.exists()

    gone = spawn("-m", "api")
    pids = draining(layout, gone, time.time())
    os.killpg(gone, signal.SIGKILL)
    t0 = time.monotonic()
    assert drain_watch.watch(pids.path, 60) == 0  # the API ended by itself: the watcher ends too
    assert time.monotonic() - t0 < 10


def test_a_hangup_interrupts_a_start_like_a_term(monkeypatch):
    class Unhandled(Exception):
        pass

    def fallback(signum, frame):
        raise Unhandled

    previous = signal.signal(signal.SIGHUP, fallback)
    try:
        with pytest.raises(Interrupted):
            with _interruptible():
                os.kill(os.getpid(), signal.SIGHUP)
                time.sleep(5)
        assert signal.getsignal(signal.SIGHUP) is fallback
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_a_hangup_during_a_start_stops_what_it_began(layout, monkeypatch):
    stopped = []
    monkeypatch.setattr(commands.EngineCtl, "refuse_running", lambda self: None)
    monkeypatch.setattr(commands.EngineCtl, "refuse_unsupervised", lambda self: None)
    monkeypatch.setattr(ApiCtl, "refuse_running", lambda self: None)
    monkeypatch.setattr(commands.EngineCtl, "stop", lambda self, quiet=False: stopped.append("engine"))

    def launch(self):  # the terminal closes while the engine loads
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(5)

    monkeypatch.setattr(commands.EngineCtl, "launch", launch)
    previous = signal.signal(signal.SIGHUP, lambda signum, frame: pytest.fail("the HUP was not handled"))
    try:
        assert Services(layout).start() == 130
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert stopped == ["engine"] and not (layout.run_dir / "launch.lock").exists()


def test_a_hangup_does_not_cut_a_stop_short(layout, monkeypatch):
    stopped = []

    def engine_stop(self, quiet=False):
        os.kill(os.getpid(), signal.SIGHUP)
        stopped.append("engine")

    monkeypatch.setattr(commands.EngineCtl, "stop", engine_stop)
    monkeypatch.setattr(ApiCtl, "stop", lambda self, quiet=False: stopped.append("api"))
    previous = signal.signal(signal.SIGHUP, lambda signum, frame: pytest.fail("the HUP was not handled"))
    try:
        assert Services(layout).stop() == 0
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert stopped == ["engine", "api"]
