"""Operations at the edges: unwritable folders, handshake timeouts, a supervisor that vanished."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from functools import partial

import anyio
import pytest

import ipc
import ipc.connection
from api import generation
from ipc.framing import HEADER, decode_message
from engine.watchdog import SUPERVISOR_ENV, process_gone, supervisor_pid
from tests.harness import REPO


@pytest.fixture
def blocked(tmp_path):
    """A path no one can create folders under, root included: a regular file is in the way."""
    (tmp_path / "file").write_text("")
    return tmp_path / "file"


def run_launch(tmp_path, command: str, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "empty.env").touch()
    environ = {**os.environ, "ENV_FILE": str(tmp_path / "empty.env"), "RUN_DIR": str(tmp_path / "run"),
               "LOG_DIR": str(tmp_path / "logs"), "API_PORT": "1", **env}
    return subprocess.run([str(REPO / "launch.sh"), command], env=environ, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("variable", ["RUN_DIR", "LOG_DIR", "SOCKET_PATH"])
@pytest.mark.parametrize("command", ["start", "restart-api", "restart-engine"])
def test_an_unwritable_folder_is_one_sentence_naming_the_variable(tmp_path, blocked, variable, command):
    value = str(blocked / "sub" / ("engine.sock" if variable == "SOCKET_PATH" else "dir"))
    r = run_launch(tmp_path, command, **{variable: value})
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"launch.sh: {variable}={value}: ")
    assert f"{blocked} is a file, not a folder" in lines[0] and f"set {variable} to a path you can write to" in lines[0]
    assert not (tmp_path / "run" / "engine.pid").exists() and not (tmp_path / "run" / "api.pid").exists()


def test_the_supervisor_names_an_unwritable_run_dir(tmp_path, blocked):
    env = {**os.environ, "ENV_FILE": str(tmp_path / "none.env"), "RUN_DIR": str(blocked / "run"),
           "SOCKET_PATH": str(tmp_path / "e.sock")}
    r = subprocess.run([sys.executable, "-m", "ops.supervisor", "--", "true"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"RUN_DIR={blocked / 'run'}: cannot create the folder {blocked / 'run'} (Not a directory); "
        "set RUN_DIR to a folder you can write to"]


@pytest.mark.anyio
async def test_a_handshake_timeout_says_what_timed_out(tmp_path, monkeypatch):
    monkeypatch.setattr(ipc.connection, "HANDSHAKE_TIMEOUT", 0.2)
    path = tmp_path / "s.sock"
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(str(path))
    silent.listen()
    try:  # accepts (the kernel's backlog) but never answers
        with pytest.raises(ipc.EngineUnavailable) as info:
            await ipc.connect(path)
    finally:
        silent.close()
    assert str(info.value) == (f"engine handshake failed: the engine accepted the connection on {path} but sent "
                               "no welcome within 0.2 s (busy or frozen?)")


@pytest.mark.anyio
async def test_a_client_that_never_says_hello_is_told_what_timed_out(tmp_path, monkeypatch):
    monkeypatch.setattr(ipc.connection, "HANDSHAKE_TIMEOUT", 0.2)
    path = tmp_path / "s.sock"

    async def never_called(conn: ipc.FramedStream) -> None:
        raise AssertionError("no handshake, no handler")

    async with anyio.create_task_group() as tg:
        await tg.start(partial(ipc.serve_unix, path, never_called))
        async with await anyio.connect_unix(str(path)) as raw:  # and never sends its hello
            received = b""
            with anyio.fail_after(10):
                try:
                    while True:
                        received += await raw.receive()
                except anyio.EndOfStream:
                    pass
        tg.cancel_scope.cancel()
    reply = decode_message(received[HEADER.size:])
    assert isinstance(reply, ipc.Error) and reply.message == "handshake failed: no complete hello within 0.2 s"


@pytest.mark.anyio
async def test_a_drain_deadline_ends_open_streams_with_an_error_event_then_done(engine, client, monkeypatch):
    monkeypatch.setattr(generation, "_drain_message", "")  # module state: restored after the test
    engine.hold(["Hel"])
    ended = []

    async def deadline() -> None:
        while not generation._open_waits:
            await anyio.sleep(0.01)
        ended.append(generation.end_open_streams("the API server is stopping; retry"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(deadline)
        r = await client.post("/v1/chat/completions", json={"model": "test-model", "stream": True,
                                                            "messages": [{"role": "user", "content": "hi"}]})
    assert ended == [1]
    lines = [line for line in r.text.splitlines() if line]
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2].removeprefix("data: "))["error"] == {
        "message": "the API server is stopping; retry", "type": "server_error", "param": None, "code": "shutting_down"}
    assert '"content":"Hel"' in r.text
    # A request that comes after the deadline gets no tokens either: a 503, not a hang.
    r = await client.post("/v1/chat/completions", json={"model": "test-model",
                                                        "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"


def test_a_reaped_process_is_gone_and_a_live_one_is_not():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(30)
    assert process_gone(child.pid)
    assert not process_gone(os.getpid())


def test_zombies_count_as_gone():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        # Not reaped yet: a zombie until wait(); kill -0 alone would call it alive.
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
        assert process_gone(child.pid)
    finally:
        child.wait(30)


def test_the_supervisor_is_watched_only_on_its_own_host():
    here = socket.gethostname()
    assert supervisor_pid({SUPERVISOR_ENV: f"{here} 4242"}) == 4242
    assert supervisor_pid({SUPERVISOR_ENV: "another-host 4242"}) is None
    assert supervisor_pid({}) is None
