"""Pid files name our processes, not just live pids: a reused pid is stale and never signalled; a
replaced API that hangs past its drain deadline is killed; restart-api keeps the old API when the new
one's settings are refused; a HUP during start undoes it as a TERM does."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from config import load_settings
from ops import api_ctl, commands, drain_watch, interrupt, pidfile, procs
from ops import status as status_mod
from ops.api_ctl import ApiCtl
from ops.commands import Services
from ops.interrupt import Interrupted, interruptible
from ops.layout import Die, Layout
from ops.pidfile import COMMANDS, Busy, Lock, PidFile, Record, runs_one_of, stop_recorded
from ops.procs import free_port, group_alive, poll, process_start
from ops.status import api_status, draining_status, status

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
REPO = Path(__file__).resolve().parents[2]


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


def test_the_drain_watcher_kills_a_hung_replaced_api_at_its_deadline(layout, spawn):
    hung = spawn("-m", "api")
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
            with interruptible():
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


# ---- review mends: restart-api never leaves no API, pid files are dropped only as judged -----------------


def failing_api(message: str):
    """An ApiCtl.start whose API logs `cannot listen on HOST:PORT: message` and exits 1, as the API does."""

    def start(self, *args):
        line = f"ERROR api: cannot listen on {self.listen}: {message} (set API_HOST/API_PORT, or stop what uses it)\n"
        script = f"import sys; open({str(self.layout.api_log)!r}, 'a').write({line!r}); sys.exit(1)"
        popen = api_ctl.spawn_group([sys.executable, "-c", script], self.layout.api_console_log)
        self.last = popen
        self.pids.write(popen.pid, listen=self.listen, drain=self.settings.API_DRAIN_TIMEOUT)
        return popen.pid

    return start


def restart_api_beside(layout, monkeypatch, old: int, message: str) -> tuple[int, list[str]]:
    """restart-api with a new API that exits with message: its exit code, and what it did the plain way, in
    order ("stop old": the old API, group old, was stopped; "launch": a new one was started after)."""
    done: list[str] = []
    monkeypatch.setattr(ApiCtl, "start", failing_api(message))
    monkeypatch.setattr(ApiCtl, "refuse_running", lambda self: None)
    monkeypatch.setattr(ApiCtl, "launch", lambda self, want: done.append("launch") or 4242)
    monkeypatch.setattr(commands.EngineCtl, "info", lambda self: None)
    real_stop = ApiCtl.stop

    def stop(self, quiet=False):
        if self.pids.read() == old:
            done.append("stop old")
        else:
            real_stop(self, quiet)

    monkeypatch.setattr(ApiCtl, "stop", stop)
    return Services(layout).restart_api(), done


@pytest.mark.parametrize(("message", "old_listen", "falls_back"), [
    ("Cannot assign requested address", None, False),  # API_HOST not of this host
    ("Permission denied", None, False),  # a privileged port
    ("Address already in use", "127.0.0.1:1", False),  # a new API_PORT another program holds
    ("Address already in use", None, True),  # the old API holds our very address without SO_REUSEPORT
])
def test_restart_api_stops_the_old_api_only_when_it_holds_the_address(layout, spawn, monkeypatch, capsys, message,
                                                                     old_listen, falls_back):
    old = spawn("-m", "api")
    PidFile(layout.api_pid).write(old, listen=old_listen or ApiCtl(layout).listen, drain=1.0)
    before = layout.api_pid.read_text()
    code, done = restart_api_beside(layout, monkeypatch, old, message)
    if falls_back:
        assert code == 0 and done == ["stop old", "launch"]
    else:
        assert code == 1 and done == [] and "keeps serving" in capsys.readouterr().err
        assert layout.api_pid.read_text() == before and group_alive(old)
    assert not layout.draining_files()


@pytest.mark.parametrize(("message", "falls_back"), [
    ("Address already in use", True),  # it predates SO_REUSEPORT and holds our very address
    ("Cannot assign requested address", False),  # API_HOST not of this host: no reason to stop it
])
def test_an_old_api_whose_pid_file_does_not_say_where_it_listens_is_replaced_the_plain_way(
        layout, spawn, monkeypatch, capsys, message, falls_back):
    old = spawn("-m", "api")
    layout.api_pid.write_text(f"{old}\n")  # as an older launch.sh wrote it: the pid alone
    code, done = restart_api_beside(layout, monkeypatch, old, message)
    err = capsys.readouterr().err
    if falls_back:  # one piece of advice: the plain restart it does, no "keeps serving", no "run restart"
        assert code == 0 and done == ["stop old", "launch"]
        assert "the plain way" in err and "keeps serving" not in err and "./launch.sh restart " not in err
    else:
        assert code == 1 and done == [] and group_alive(old) and PidFile(layout.api_pid).read() == old
        assert err.count("keeps serving") == 1 and "the plain way" not in err and "./launch.sh restart " not in err
    assert not layout.draining_files()


def test_a_started_api_records_where_it_listens_and_its_drain_timeout(layout, monkeypatch, spawn):
    pid = spawn("-m", "api")
    monkeypatch.setattr(api_ctl, "spawn_group", lambda *a, **kw: type("P", (), {"pid": pid})())
    api = ApiCtl(layout)
    assert api.start() == pid
    record = api.pids.record()
    assert record.listen == f"127.0.0.1:{layout.settings.API_PORT}" and record.drain == 1.0
    assert Record.parse(record.text()) == record


@pytest.mark.parametrize("ignored", [signal.SIGHUP, signal.SIGTERM])
def test_a_signal_already_ignored_nohup_stays_ignored(layout, monkeypatch, ignored):
    previous = signal.signal(ignored, signal.SIG_IGN)
    try:
        with interruptible():
            assert signal.getsignal(ignored) == signal.SIG_IGN
            os.kill(os.getpid(), ignored)  # nothing happens: no Interrupted
            time.sleep(0.2)
        assert signal.getsignal(ignored) == signal.SIG_IGN

        seen = []
        monkeypatch.setattr(commands.EngineCtl, "stop", lambda self, quiet=False: seen.append(signal.getsignal(ignored)))
        monkeypatch.setattr(ApiCtl, "stop", lambda self, quiet=False: None)
        assert Services(layout).stop() == 0
        assert seen == [signal.SIG_IGN] and signal.getsignal(ignored) == signal.SIG_IGN
    finally:
        signal.signal(ignored, previous)


def test_restart_with_a_setting_the_api_refuses_stops_nothing(tmp_path, monkeypatch):
    (tmp_path / "empty.env").touch()
    layout = Layout(load_settings({"RUN_DIR": str(tmp_path / "run"), "LOG_DIR": str(tmp_path / "logs"),
                                   "API_PORT": str(free_port()), "SOCKET_PATH": str(tmp_path / "e.sock"),
                                   "API_KEYS_FILE": "/nonexistent/keys"}, tmp_path / "empty.env"))
    monkeypatch.setattr(Services, "stop", lambda self: pytest.fail("stopped before the setting was checked"))
    with pytest.raises(Die) as died:
        Services(layout).restart()
    assert died.value.code == 2


def test_drop_removes_only_the_record_judged_stale(tmp_path, spawn):
    pids = PidFile(tmp_path / "api.pid")
    pids.save(Record(spawn(), "another-start"))
    record, pid, why = pids.judge()
    assert pid is None and "another time" in why
    fresh = spawn("-m", "api")
    pids.write(fresh)  # a concurrent start wrote its file meanwhile
    pids.drop(record)
    assert pids.read() == fresh
    pids.drop(pids.record())
    assert not pids.path.exists()


LOCK_HOLDER = """
import sys, time
from ops.pidfile import Lock
lock = Lock(sys.argv[1])
lock.acquire()
print("held", flush=True)
time.sleep(60)
"""


def test_a_held_lock_is_busy_whatever_its_file_says(tmp_path):
    path = tmp_path / "launch.lock"
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(path)], stdout=subprocess.PIPE, text=True,
                              cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        path.write_text("garbage\n")  # unreadable, or a holder long gone: the flock still says who holds it
        with pytest.raises(Busy):
            Lock(path).acquire()
        path.write_text("999999\n")
        with pytest.raises(Busy):
            Lock(path).acquire()
    finally:
        holder.kill()
        holder.communicate(timeout=10)
    lock = Lock(path)
    lock.acquire()  # its holder died (SIGKILL): the flock went with it
    assert PidFile(path).read() == os.getpid()
    lock.release()
    assert not path.exists()


def test_the_drain_deadline_is_the_one_the_replaced_api_started_with(layout, spawn):
    slow = spawn("-m", "api")
    pids = PidFile(layout.run_dir / f"api.draining.{slow}")
    pids.save(Record(slow, process_start(slow), time.time() - 20, drain=60.0))  # its own API_DRAIN_TIMEOUT=60
    api = ApiCtl(layout)  # this command's API_DRAIN_TIMEOUT=1
    assert api.overdue(pids) is None and api.stop_timeout_of(pids.record()) == 67
    api.reap_drained()
    assert group_alive(slow) and pids.path.exists()
    assert draining_status(layout, api)[0]


def test_restart_api_interrupted_while_the_new_api_starts_rolls_back(layout, spawn, monkeypatch, capsys):
    old = spawn("-m", "api")
    PidFile(layout.api_pid).write(old, listen=ApiCtl(layout).listen, drain=1.0)
    before = layout.api_pid.read_text()
    new = []

    def start(self, *args):
        popen = subprocess.Popen([*SLEEPER, "-m", "api"], start_new_session=True, stdin=subprocess.DEVNULL)
        new.append(popen)
        self.last = popen
        self.pids.write(popen.pid, listen=self.listen, drain=1.0)
        return popen.pid

    def poll_interrupted(*args, **kw):  # Ctrl-C while waiting for the new API to listen
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)

    monkeypatch.setattr(ApiCtl, "start", start)
    monkeypatch.setattr(api_ctl, "poll", poll_interrupted)
    monkeypatch.setattr(commands.EngineCtl, "info", lambda self: None)
    try:
        assert Services(layout).restart_api() == 130
        assert layout.api_pid.read_text() == before and group_alive(old)
        assert new[0].wait(10) is not None and not layout.draining_files()
        assert not list(layout.run_dir.glob("api.ready.*")) and not (layout.run_dir / "launch.lock").exists()
        assert "keeps serving" in capsys.readouterr().err
    finally:
        for p in new:
            p.kill()
            p.wait(10)


def test_a_hand_over_a_killed_restart_api_left_is_finished_by_the_next_command(layout, spawn, monkeypatch, signals):
    watched = []
    monkeypatch.setattr(ApiCtl, "watch_drain", lambda self, draining: watched.append(draining.path))
    old = spawn("-m", "api")
    draining = PidFile(layout.run_dir / f"api.draining.{old}")
    draining.write(old)  # moved aside, never told to stop
    (layout.run_dir / "api.ready.999999").write_text("1\n")
    api = ApiCtl(layout)
    api.reap_drained()  # no new API runs: the old one is the API again
    assert api.pids.read() == old and not draining.path.exists() and signals == []
    assert not list(layout.run_dir.glob("api.ready.*"))

    new = spawn("-m", "api")
    api.pids.path.rename(draining.path)
    api.pids.write(new)  # the new API came up, then the restart-api was killed
    api.reap_drained()
    assert (-old, signal.SIGTERM) in signals and watched == [draining.path]
    assert draining.record().stopping_since is not None and api.pids.read() == new


def test_a_stop_is_protected_from_signals_while_it_reaps(layout, monkeypatch):
    stopped = []

    def reap(self):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)

    monkeypatch.setattr(ApiCtl, "reap_drained", reap)
    monkeypatch.setattr(commands.EngineCtl, "stop", lambda self, quiet=False: stopped.append("engine"))
    monkeypatch.setattr(ApiCtl, "stop", lambda self, quiet=False: stopped.append("api"))
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: pytest.fail("the TERM was not held off"))
    try:
        assert Services(layout).stop() == 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stopped == ["engine", "api"]


def test_the_ssh_wrapper_mlx_launch_runs_names_the_engine():
    wrapper = 'ssh host cd /srv/mcs && cmd=(/srv/mcs/.venv/bin/python -m engine); exec "${cmd[@]}"'
    assert runs_one_of(wrapper, COMMANDS["engine"])
    assert not runs_one_of("python -m engineer", COMMANDS["engine"])


def test_a_pid_file_is_trusted_when_ps_cannot_be_read(tmp_path, spawn, monkeypatch):
    pid = spawn("-m", "api")
    pids = PidFile(tmp_path / "api.pid")
    pids.path.write_text(f"{pid}\n")  # judged by what it runs, which ps must tell

    def failing_run(*args, **kw):
        raise subprocess.TimeoutExpired("ps", 10)

    monkeypatch.setattr(procs.subprocess, "run", failing_run)
    with pytest.raises(procs.Unreadable):
        procs.command_line(pid)
    assert pids.clear_stale() == pid and pids.path.exists()

    def failing_popen(*args, **kw):
        raise OSError("fork failed")

    monkeypatch.setattr(procs.subprocess, "Popen", failing_popen)
    assert group_alive(pid)  # ps cannot list the group: kill -0 says it lives
    assert pids.running() == pid


def test_a_drained_api_leaves_no_file_and_temp_files_are_not_draining_files(layout, spawn):
    gone = spawn("-m", "api")
    pids = draining(layout, gone, time.time())
    (layout.run_dir / f"api.draining.{gone}.tmp.4242").write_text("x")
    assert layout.draining_files() == [pids.path]
    os.killpg(gone, signal.SIGKILL)
    assert poll(lambda: not group_alive(gone), 10)
    assert drain_watch.watch(pids.path, 60) == 0 and not pids.path.exists()

    other = spawn("-m", "api")
    pids = draining(layout, other, time.time())
    os.killpg(other, signal.SIGKILL)
    assert poll(lambda: not group_alive(other), 10)
    fine, lines = draining_status(layout, ApiCtl(layout))
    assert fine and lines == [] and not pids.path.exists()  # ended as it should: removed, not reported


def test_status_gives_the_drain_watcher_time_to_kill_before_calling_an_api_overdue(layout, spawn):
    hung = spawn("-m", "api")
    api = ApiCtl(layout)
    pids = draining(layout, hung, time.time() - layout.api_stop_timeout - 2)  # the watcher is at it
    assert api.overdue(pids) is not None
    assert draining_status(layout, api)[0]
    pids = draining(layout, hung, time.time() - 60)
    fine, lines = draining_status(layout, api)
    assert not fine and "restart-engine or restart-api kills it" in "\n".join(lines)


# ---- second review mends: a failed ps is no proof, signals never land between a step's halves ----------------


def failing_popen(*args, **kw):
    raise OSError("fork failed")


def test_a_failed_ps_never_passes_for_a_group_gone(layout, spawn, monkeypatch, signals, capsys):
    pid = spawn("-m", "api")
    pids = PidFile(layout.api_pid)
    pids.write(pid)
    supervisor = spawn("-m", "ops.supervisor")
    PidFile(layout.engine_pid).write(supervisor)
    monkeypatch.setattr(procs.subprocess, "Popen", failing_popen)  # ps cannot be run from here on
    monkeypatch.setattr(procs, "KILL_WAIT", 0.2)
    assert not procs.stop_group(pid, 0.2)
    assert signals == [(-pid, signal.SIGTERM), (-pid, signal.SIGKILL)]  # its KILL when due, not "gone"
    assert procs.process_alive(pid)
    commands.EngineCtl(layout).refuse_unsupervised()  # no "runs without its supervisor"

    signals.clear()
    stop_recorded("api", pids, 0.2)
    assert (-pid, signal.SIGKILL) in signals and pids.read() == pid  # not proven gone: the file stays
    assert "survived SIGKILL, or ps cannot tell" in capsys.readouterr().err


def test_a_signal_while_the_new_api_starts_waits_until_its_pid_file_is_written(layout, spawn, monkeypatch):
    pid = spawn("-m", "api")

    def spawned(*args, **kw):  # the TERM lands right after the fork, before anything records the API
        signal.raise_signal(signal.SIGTERM)
        return type("P", (), {"pid": pid})()

    monkeypatch.setattr(api_ctl, "spawn_group", spawned)
    api = ApiCtl(layout)
    with pytest.raises(Interrupted):
        with interruptible():
            api.start("--take-over")
    assert api.last.pid == pid and api.pids.read() == pid  # roll_back can find and stop it


def test_the_hand_over_step_is_done_whole_and_masks_no_signal(layout, spawn, monkeypatch, signals):
    old = spawn("-m", "api")
    draining_file = PidFile(layout.run_dir / f"api.draining.{old}")
    draining_file.write(old)
    masks = []
    real_mark = PidFile.mark_stopping

    def mark_stopping(self):
        signal.raise_signal(signal.SIGINT)  # Ctrl-C between "told to stop" and "watched"
        real_mark(self)

    monkeypatch.setattr(PidFile, "mark_stopping", mark_stopping)
    monkeypatch.setattr(ApiCtl, "watch_drain",
                        lambda self, d: masks.append(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
    api = ApiCtl(layout)
    api.handing = (draining_file, old)
    with pytest.raises(Interrupted):
        with interruptible():
            with interrupt.deferred():
                api._retire(draining_file, old)
                api.handing = None
    assert (-old, signal.SIGTERM) in signals and len(masks) == 1 and api.handing is None
    assert not set(interrupt.ENDING_SIGNALS) & masks[0]  # a process started there inherits no blocked signals
    assert not api.roll_back()


def test_a_signal_as_an_interruptible_block_ends_is_no_traceback(monkeypatch):
    real_signal, ending = signal.signal, []

    def put_back(sig, handler):  # a TERM lands while the handlers are being put back
        if ending:
            ending.clear()
            signal.raise_signal(signal.SIGTERM)
        return real_signal(sig, handler)

    previous = real_signal(signal.SIGTERM, lambda signum, frame: pytest.fail("the TERM reached the old handler"))
    try:
        with interruptible():
            monkeypatch.setattr(signal, "signal", put_back)
            ending.append(True)
    finally:
        monkeypatch.undo()
        real_signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("error", [Interrupted, KeyboardInterrupt])
def test_an_interrupted_command_exits_130_with_one_line(monkeypatch, capsys, error):
    import ops.cli as entry

    def run(command, args):
        raise error

    monkeypatch.setattr(entry, "run", run)
    assert entry.main(["status"]) == 130
    assert capsys.readouterr().err == "launch.sh: interrupted\n"


def test_a_status_during_a_hand_over_leaves_the_file_of_an_api_that_lives(layout, spawn):
    alive = spawn("-m", "api")
    handing = PidFile(layout.run_dir / f"api.draining.{alive}")
    handing.save(Record(alive, "another-start"))  # judged not ours, but a hand-over's record whose group lives
    fine, lines = draining_status(layout, ApiCtl(layout))
    assert handing.path.exists() and "being replaced" in "\n".join(lines)


def test_restart_api_survives_a_status_that_drops_the_file_of_an_old_api_that_ended(layout, spawn, monkeypatch,
                                                                                   capsys):
    old = spawn("-m", "api")
    PidFile(layout.api_pid).write(old, listen=ApiCtl(layout).listen, drain=1.0)
    failing = failing_api("Cannot assign requested address")

    def start(self, *args):  # the old API dies meanwhile, and a status drops its file
        os.killpg(old, signal.SIGKILL)
        assert poll(lambda: not group_alive(old), 10)
        draining_status(layout, ApiCtl(layout))
        return failing(self, *args)

    monkeypatch.setattr(ApiCtl, "start", start)
    monkeypatch.setattr(commands.EngineCtl, "info", lambda self: None)
    assert Services(layout).restart_api() == 1
    err = capsys.readouterr().err
    assert "ended meanwhile: no API runs" in err and "keeps serving" not in err

    # A killed restart-api's hand-over whose file goes as the next command finishes it.
    gone = spawn("-m", "api")
    draining(layout, gone, None)
    real_move = PidFile.move_to

    def move_to(self, other):
        self.path.unlink()
        return real_move(self, other)

    monkeypatch.setattr(PidFile, "move_to", move_to)
    ApiCtl(layout).reap_drained()
    assert not layout.api_pid.exists()


def test_without_flock_the_lock_is_a_linked_file(layout, spawn, monkeypatch):
    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(pidfile.fcntl, "flock", no_flock)
    path = layout.run_dir / "launch.lock"
    lock = Lock(path)
    lock.acquire()
    assert lock.held and PidFile(path).read() == os.getpid()
    lock.release()
    assert not path.exists()

    holder = spawn("-m", "ops", "restart")  # a live launch.sh holds it, by its file alone
    PidFile(path).write(holder)
    with pytest.raises(Die) as died:
        Services(layout).stop()
    assert f"pid {holder}" in str(died.value) and f"remove {path}" in str(died.value)
    assert PidFile(path).read() == holder


def test_a_lock_held_by_flock_is_not_to_be_removed(layout):
    path = layout.run_dir / "launch.lock"
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(path)], stdout=subprocess.PIPE, text=True,
                              cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(Die) as died:
            Services(layout).stop()
        assert f"pid {holder.pid}" in str(died.value) and "remove" not in str(died.value)
    finally:
        holder.kill()
        holder.communicate(timeout=10)


# ---- third review mends: a stop's signal ends a restart, hand-overs are marked, stopped APIs get KILL ----------


def test_a_signal_during_a_restarts_stop_lets_the_stop_finish_and_starts_nothing(layout, monkeypatch, capsys):
    stopped = []

    def engine_stop(self, quiet=False):
        signal.raise_signal(signal.SIGTERM)
        stopped.append("engine")

    monkeypatch.setattr(ApiCtl, "check_config", lambda self: None)
    monkeypatch.setattr(commands.EngineCtl, "stop", engine_stop)
    monkeypatch.setattr(ApiCtl, "stop", lambda self, quiet=False: stopped.append("api"))
    monkeypatch.setattr(Services, "start", lambda self: pytest.fail("the restart went on to start"))
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: pytest.fail("the TERM was not handled"))
    try:
        assert Services(layout).restart() == 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stopped == ["engine", "api"] and "nothing was started" in capsys.readouterr().err


def test_a_signal_noted_before_a_restarts_start_begins_starts_nothing(layout, monkeypatch):
    monkeypatch.setattr(ApiCtl, "check_config", lambda self: None)
    monkeypatch.setattr(Services, "stop", lambda self: 0)
    monkeypatch.setattr(commands.EngineCtl, "refuse_unsupervised",
                        lambda self: signal.raise_signal(signal.SIGHUP))  # after the stop, before the start's first step
    monkeypatch.setattr(commands.EngineCtl, "launch", lambda self: pytest.fail("the restart started the engine"))
    previous = signal.signal(signal.SIGHUP, lambda signum, frame: pytest.fail("the HUP was not handled"))
    try:
        assert Services(layout).restart() == 130
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_a_ctrl_c_during_restart_engines_stop_finishes_the_stop_and_starts_nothing(layout, monkeypatch, capsys):
    stopped = []

    def engine_stop(self, quiet=False):
        signal.raise_signal(signal.SIGINT)
        stopped.append("engine")  # the pid file goes only here: an exception above would leave it

    monkeypatch.setattr(commands.EngineCtl, "stop", engine_stop)
    monkeypatch.setattr(commands.EngineCtl, "launch", lambda self: pytest.fail("restart-engine started the engine"))
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pytest.fail("the Ctrl-C was not handled"))
    try:
        assert Services(layout).restart_engine() == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    assert stopped == ["engine"] and "the engine is stopped" in capsys.readouterr().err
    assert not (layout.run_dir / "launch.lock").exists()


def test_a_hangup_while_restart_engine_starts_the_engine_undoes_the_start(layout, monkeypatch, capsys):
    stopped = []
    monkeypatch.setattr(commands.EngineCtl, "stop", lambda self, quiet=False: stopped.append("engine"))
    monkeypatch.setattr(commands.EngineCtl, "refuse_running", lambda self: None)

    def launch(self):  # the terminal closes while the engine loads
        signal.raise_signal(signal.SIGHUP)
        pytest.fail("the HUP did not interrupt the start")

    monkeypatch.setattr(commands.EngineCtl, "launch", launch)
    previous = signal.signal(signal.SIGHUP, lambda signum, frame: pytest.fail("the HUP was not handled"))
    try:
        assert Services(layout).restart_engine() == 130
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert stopped == ["engine", "engine"]  # the stop half, then the undoing of the start half
    assert "the engine is stopped" in capsys.readouterr().err


def test_an_api_mid_hand_over_is_the_running_api_and_an_old_format_one_is_marked(layout, spawn, monkeypatch, signals):
    old = spawn("-m", "api")
    layout.api_pid.write_text(f"{old}\n")  # an older launch.sh's one-line file
    seen = []

    class Killed(Exception):
        pass

    def start(self, *args):  # moved aside, the new API not yet recorded: a status runs, then kill -9
        seen.append(PidFile(layout.run_dir / f"api.draining.{old}").record())
        seen.append(api_status(layout, ApiCtl(layout))[0])
        seen.append(status(layout))
        raise Killed

    monkeypatch.setattr(ApiCtl, "start", start)
    monkeypatch.setattr(ApiCtl, "health", lambda self: "200")
    monkeypatch.setattr(status_mod, "engine_status", lambda layout, engine: ("up", []))
    with pytest.raises(Killed):
        ApiCtl(layout).hand_over(old)
    record, api_state, code = seen
    assert record.handing_over and record.handover_since is not None and record.start == process_start(old)
    assert api_state == "up" and code == 0

    api = ApiCtl(layout)
    draining_file = PidFile(layout.run_dir / f"api.draining.{old}")
    assert api.overdue(draining_file, slack=-1e6) is None  # never taken for an older launch.sh's rename
    api.reap_drained()  # finished as a hand-over: no new API, so the old one is the API again
    assert signals == [] and api.pids.read() == old and api.pids.record().handover_since is None


def test_one_look_at_a_stopped_api_is_not_enough_to_kill_it(layout, spawn, monkeypatch, request):
    # macOS's ps shows T for a process a debugger or a sampler holds for a moment: a replaced API seen stopped
    # once is told to drain like any other (TERM waits until it runs again), not killed with its open streams.
    paused = spawn("-m", "api")
    os.killpg(paused, signal.SIGSTOP)
    assert poll(lambda: procs.group_frozen(paused), 10)
    signals = request.getfixturevalue("signals")
    monkeypatch.setattr(ApiCtl, "watch_drain", lambda self, d: None)
    draining_file = PidFile(layout.run_dir / f"api.draining.{paused}")
    draining_file.write(paused)
    ApiCtl(layout)._retire(draining_file, paused)
    assert signals == [(-paused, signal.SIGTERM)]
    looks = iter([True, False, True])
    monkeypatch.setattr(procs, "group_frozen", lambda pgid: next(looks))
    assert not procs.group_frozen_for_good(paused, spacing=0)


def test_status_names_a_stopped_api_and_the_next_command_kills_it(layout, spawn, monkeypatch):
    frozen = spawn("-m", "api")
    os.killpg(frozen, signal.SIGSTOP)
    assert poll(lambda: procs.group_frozen(frozen), 10)
    PidFile(layout.api_pid).write(frozen)
    state, lines = api_status(layout, ApiCtl(layout))
    assert state == "degraded" and "STOPPED (SIGSTOP)" in lines[0]

    layout.api_pid.unlink()
    pids = draining(layout, frozen, time.time())  # told to stop just now: far from its deadline
    fine, lines = draining_status(layout, ApiCtl(layout))
    assert not fine and "STOPPED (SIGSTOP)" in "\n".join(lines)
    ApiCtl(layout).reap_drained()
    assert poll(lambda: not group_alive(frozen), 10) and not pids.path.exists()


def test_the_drain_watcher_kills_a_stopped_api_without_waiting_for_its_deadline(layout, spawn, monkeypatch):
    frozen = spawn("-m", "api")
    os.killpg(frozen, signal.SIGSTOP)
    assert poll(lambda: procs.group_frozen(frozen), 10)
    pids = draining(layout, frozen, time.time())
    killed, waits = [], []
    monkeypatch.setattr(drain_watch, "stop_group", lambda pid, grace: killed.append(pid) or True)
    monkeypatch.setattr(drain_watch, "time", SimpleNamespace(time=time.time, strftime=time.strftime,
                                                             sleep=waits.append))
    assert drain_watch.watch(pids.path, 600) == 0
    # stopped on FROZEN_READINGS looks in a row (a debugger's pause is one), then killed, long before 600 s
    assert killed == [frozen] and not pids.path.exists()
    assert len(waits) == procs.FROZEN_READINGS - 1


def test_a_ctrl_c_during_the_entry_points_imports_is_one_line(monkeypatch, capsys):
    import importlib.abc
    import runpy

    class Interrupting(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "ops.cli":
                raise KeyboardInterrupt
            return None

    monkeypatch.delitem(sys.modules, "ops.cli", raising=False)
    monkeypatch.delitem(sys.modules, "ops.__main__", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Interrupting(), *sys.meta_path])
    with pytest.raises(SystemExit) as ended:
        runpy.run_module("ops", run_name="__main__")
    assert ended.value.code == 130 and capsys.readouterr().err == "launch.sh: interrupted\n"


@pytest.mark.parametrize("text", ["99999999999999999999\n", f"{2**31}\nstart x\n", "\u00b2\n", "9" * 5000 + "\n"])
def test_a_pid_beyond_any_pid_is_a_malformed_file(layout, text, capsys):
    assert Record.parse(text) is None
    layout.api_pid.write_text(text)
    assert status(layout) in (1, 3)  # no OverflowError
    assert not layout.api_pid.exists()
