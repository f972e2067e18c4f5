"""ops/ helpers without the services: pid files, the launch lock, process groups, the state file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from ipc.lifecycle import ExitCause
from ops.layout import ceil_seconds, client_host
from ops.pidfile import Busy, Lock, PidFile
from ops.procs import Group, group_alive, poll, stop_group
from ops.state import EngineState, LastFailure, read_state, state_path, write_state


def test_a_pid_file_is_written_whole_and_unlinked_only_by_its_owner(tmp_path):
    pids = PidFile(tmp_path / "x.pid")
    assert pids.read() is None
    pids.write(4242)
    assert pids.read() == 4242 and [p.name for p in tmp_path.iterdir()] == ["x.pid"]
    pids.unlink(1)  # another's pid: left alone
    assert pids.read() == 4242
    pids.unlink(4242)
    assert not pids.path.exists()


def test_the_lock_refuses_a_live_holder_and_takes_over_a_stale_one(tmp_path):
    path = tmp_path / "launch.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        PidFile(path).write(holder.pid)  # with its start time: the very process that wrote it
        with pytest.raises(Busy) as busy:
            Lock(path).acquire()
        assert busy.value.args[0] == holder.pid
    finally:
        holder.kill()
        holder.wait(10)
    lock = Lock(path)
    lock.acquire()  # its holder is gone: stale
    assert PidFile(path).read() == os.getpid()
    lock.release()
    assert not path.exists()


def test_stop_group_ends_a_group_that_ignores_term(tmp_path):
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    g = Group.spawn([sys.executable, "-c", stubborn], tmp_path / "log")
    assert poll(lambda: "up" in g.log_tail(), 30)
    killed = []
    assert stop_group(g.pid, 0.3, on_kill=killed.append)
    assert killed and g.pid in killed[0]
    g.popen.wait(5)
    assert g.popen.returncode == -signal.SIGKILL and not group_alive(g.pid)


def test_state_file_round_trip_belongs_to_its_supervisor(tmp_path):
    path = state_path(tmp_path)
    state = EngineState(pid=77, state="failed", last_failure=LastFailure(time=1.0, summary="rank 1 gone", rank=1))
    write_state(path, state)
    assert read_state(path, 77) == state
    assert read_state(path, 78) is None  # left by another start


def test_exit_causes_are_the_codes_ranks_exit_with():
    assert (ExitCause.DESYNC, ExitCause.PEER_LOST, ExitCause.STALLED) == (3, 4, 70)


@pytest.mark.parametrize(("value", "whole"), [(0.1, 1), (10.0, 10), (10.2, 11), (1e12, 86400), (float("inf"), 86400)])
def test_ceil_seconds(value, whole):
    assert ceil_seconds(value) == whole


@pytest.mark.parametrize(("host", "client"), [("0.0.0.0", "127.0.0.1"), ("::", "[::1]"), ("::1", "[::1]"),
                                              ("[::1]", "[::1]"), ("10.0.0.2", "10.0.0.2")])
def test_client_host(host, client):
    assert client_host(host) == client
