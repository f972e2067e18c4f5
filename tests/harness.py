"""Start and stop the real engine and API for tests: free ports, bounded waits, stop by PID.

Used by the integration and multi-rank tests (vLLM's RemoteOpenAIServer pattern).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
MLX_LAUNCH = str(Path(PYTHON).parent / "mlx.launch")
# Shared by every test run: the demo model is generated once, deterministically.
MODEL_CACHE = REPO / ".cache" / "models"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_run(n: int) -> int:
    """The first of n consecutive free ports (the ring backend listens on port, port+1, ...)."""
    for _ in range(50):
        base = free_port()
        if base + n > 65535:
            continue
        socks = []
        try:
            for k in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + k))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports found")


def short_dir(prefix: str) -> Path:
    """A temp dir under /tmp: Unix socket paths must stay short."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


class PortTaken(RuntimeError):
    """A rank could not bind its ring port."""


@dataclass
class Proc:
    """A process group we started; stop() ends all of it."""

    popen: subprocess.Popen
    log: Path
    stdin_holder: object = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, timeout: float = 15.0) -> None:
        if self.alive():
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        # Whatever is left of the group (ranks the launcher did not reap) gets KILL.
        self.signal(signal.SIGKILL)
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass
        if self.stdin_holder is not None:
            self.stdin_holder.close()


@dataclass
class Stack:
    """Settings shared by an engine and its API in one test."""

    root: Path = field(default_factory=lambda: short_dir("mcs-"))
    api_port: int = field(default_factory=free_port)
    extra: dict = field(default_factory=dict)

    @property
    def socket(self) -> Path:
        return self.root / "run" / "engine.sock"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def env(self, **more: str) -> dict:
        env = dict(os.environ)
        empty_env = self.root / "empty.env"
        empty_env.touch()
        env.update(
            ENV_FILE=str(empty_env),
            RUN_DIR=str(self.root / "run"),
            LOG_DIR=str(self.root / "logs"),
            SOCKET_PATH=str(self.socket),
            MODEL_CACHE_DIR=str(MODEL_CACHE),
            API_HOST="127.0.0.1",
            API_PORT=str(self.api_port),
            RING_PORT=str(free_port_run(8)),
        )
        env.update({k: str(v) for k, v in self.extra.items()})
        env.update(more)
        return env

    def start_engine(self, ranks: int = 1, timeout: float = 180.0, **more: str) -> Proc:
        # Ring ports are machine-wide: another process may take one between our check and
        # the ranks' bind, so a bind failure gets a fresh set of ports, twice at most.
        for attempt in range(3):
            try:
                return self._start_engine(ranks, timeout, **more)
            except PortTaken:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _start_engine(self, ranks: int, timeout: float, **more: str) -> Proc:
        log = self.root / f"engine-{time.monotonic_ns()}.log"
        env = self.env(**more)
        if ranks == 1:
            cmd = [PYTHON, "-m", "engine"]
            stdin = subprocess.DEVNULL
        else:
            hosts = ",".join(["127.0.0.1"] * ranks)
            cmd = [MLX_LAUNCH, "--hosts", hosts, "--backend", "ring", "--starting-port", env["RING_PORT"],
                   "--cwd", str(REPO), "--", PYTHON, "-m", "engine"]
            env["HOSTS"] = hosts
            # An open, silent stdin pipe keeps mlx.launch's forwarding loop from spinning.
            stdin = subprocess.PIPE
        with open(log, "ab") as out:
            popen = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=stdin, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        proc = Proc(popen, log, popen.stdin if stdin == subprocess.PIPE else None)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not proc.alive():
                proc.stop()  # reap what is left of the group and close our end of its stdin
                if "Couldn't bind socket" in proc.log_tail():
                    raise PortTaken(proc.log_tail())
                raise RuntimeError(f"engine exited with {popen.returncode} before serving:\n{proc.log_tail()}")
            if self.probe() is not None:
                if proc.stdin_holder is not None:
                    proc.stdin_holder.write(b"x")
                    proc.stdin_holder.flush()
                return proc
            time.sleep(0.2)
        proc.stop()
        raise RuntimeError(f"engine did not answer on {self.socket} within {timeout:.0f} s:\n{proc.log_tail()}")

    def probe(self) -> dict | None:
        if not self.socket.exists():
            return None
        r = subprocess.run([PYTHON, "-m", "ipc.probe", "--socket", str(self.socket), "--timeout", "2"],
                           capture_output=True, text=True, timeout=20, env=self.env())
        return json.loads(r.stdout) if r.returncode == 0 else None

    def start_api(self, timeout: float = 60.0, **more: str) -> Proc:
        log = self.root / f"api-{time.monotonic_ns()}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen([PYTHON, "-m", "api"], cwd=REPO, env=self.env(**more),
                                     stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        proc = Proc(popen, log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not proc.alive():
                raise RuntimeError(f"API exited with {popen.returncode}:\n{proc.log_tail()}")
            if http_status(self.base_url + "/health") is not None:
                return proc
            time.sleep(0.1)
        proc.stop()
        raise RuntimeError(f"API did not answer on {self.base_url} within {timeout:.0f} s:\n{proc.log_tail()}")


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """The HTTP status of a GET, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


def wait_for(predicate, timeout: float, what: str):
    """Poll predicate until it returns a truthy value (returned), or fail naming what was awaited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
