"""Start and stop the real engine and API for tests: free ports, bounded waits, stop by PID.

Used by the integration and multi-rank tests (vLLM's RemoteOpenAIServer pattern).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ops.procs import Group, free_port, free_ring_port, http_status, poll

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
MLX_LAUNCH = str(Path(PYTHON).parent / "mlx.launch")
# Shared by every test run: the demo model is generated once, deterministically.
MODEL_CACHE = REPO / ".cache" / "models"


_RUN_DIR: Path | None = None


def run_dir() -> Path:
    """The one folder under /tmp that holds every short_dir of this process: tests/conftest.py removes it
    after a passing run and names it after a failing one (its stacks' logs are in there)."""
    global _RUN_DIR
    if _RUN_DIR is None:
        _RUN_DIR = Path(tempfile.mkdtemp(prefix="mcs-tests-", dir="/tmp"))
        if "pytest" not in sys.modules and not os.environ.get("KEEP_TEST_DIRS"):
            # A script using Stack (bench/cache_soak.py, docs/screenshot.py): removed when it exits.
            atexit.register(shutil.rmtree, _RUN_DIR, ignore_errors=True)
    return _RUN_DIR


def run_dir_made() -> Path | None:
    return _RUN_DIR


def short_dir(prefix: str) -> Path:
    """A temp dir under /tmp: Unix socket paths must stay short."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=run_dir()))


class PortTaken(RuntimeError):
    """A rank could not bind its ring port."""


# A process group a test started: stop() ends all of it.
Proc = Group


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
            # the disk tier of the prefix cache, per stack (entries of one test never serve another's), and off
            # unless a test turns it on: what the RAM tier evicts is then computed again, as those tests expect
            PROMPT_CACHE_DIR=str(self.root / "prompt-cache"),
            PROMPT_CACHE_DISK_BYTES="0",
            # plumbing runs on the random-weight demo (fast); a stack of the real default model says MODEL=smollm2-135m
            MODEL="demo-tiny",
            API_HOST="127.0.0.1",
            API_PORT=str(self.api_port),
            RING_PORT=str(free_ring_port(4)),
            # the demo model rarely ends on its own: requests that give no max_tokens stop here, not at the
            # context's end (a test of that path sets it to 0, the default)
            MAX_TOKENS_DEFAULT="512",
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
        else:
            hosts = ",".join(["127.0.0.1"] * ranks)
            cmd = [MLX_LAUNCH, "--hosts", hosts, "--backend", "ring", "--starting-port", env["RING_PORT"],
                   "--cwd", str(REPO), "--", PYTHON, "-m", "engine"]
            env["HOSTS"] = hosts
        # Several ranks: an open, silent stdin pipe keeps mlx.launch's forwarding loop from spinning.
        proc = Group.spawn(cmd, log, stdin_pipe=ranks > 1, env=env, cwd=REPO)
        if poll(self.probe, timeout, 0.2, alive=proc.alive) is not None:
            proc.release_stdin()
            return proc
        exited = not proc.alive()
        proc.stop()  # reap what is left of the group and close our end of its stdin
        if not exited:
            raise RuntimeError(f"engine did not answer on {self.socket} within {timeout:.0f} s:\n{proc.log_tail()}")
        if "Couldn't bind socket" in proc.log_tail():
            raise PortTaken(proc.log_tail())
        raise RuntimeError(f"engine exited with {proc.popen.returncode} before serving:\n{proc.log_tail()}")

    def probe(self) -> dict | None:
        if not self.socket.exists():
            return None
        r = subprocess.run([PYTHON, "-m", "ipc.probe", "--socket", str(self.socket), "--timeout", "2"],
                           capture_output=True, text=True, timeout=20, env=self.env())
        return json.loads(r.stdout) if r.returncode == 0 else None

    def start_api(self, timeout: float = 60.0, **more: str) -> Proc:
        log = self.root / f"api-{time.monotonic_ns()}.log"
        proc = Group.spawn([PYTHON, "-m", "api"], log, env=self.env(**more), cwd=REPO)
        if poll(lambda: http_status(self.base_url + "/health") is not None, timeout, alive=proc.alive):
            return proc
        if not proc.alive():
            raise RuntimeError(f"API exited with {proc.popen.returncode}:\n{proc.log_tail()}")
        proc.stop()
        raise RuntimeError(f"API did not answer on {self.base_url} within {timeout:.0f} s:\n{proc.log_tail()}")


@contextmanager
def serving(model: str, timeout: float = 180.0, **settings: str) -> Iterator[tuple[Stack, object]]:
    """An engine (one rank) and an API serving MODEL=model (and any other settings), and the official client to
    them; stopped after."""
    import openai

    s = Stack(extra={"MODEL": model, **settings})
    procs = [s.start_engine(timeout=timeout), s.start_api()]
    try:
        with openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0, timeout=300) as client:
            yield s, client
    finally:
        for p in reversed(procs):
            p.stop()


def assert_engine_logs_clean(stack: Stack) -> None:
    """No ERROR line and no traceback in any engine log the stack wrote."""
    log = "".join(p.read_text(errors="replace") for p in stack.root.glob("engine-*.log"))
    assert "ERROR" not in log and "Traceback" not in log, log[-3000:]


def wait_for(predicate, timeout: float, what: str):
    """Poll predicate until it returns a truthy value (returned), or fail naming what was awaited."""
    value = poll(predicate, timeout, 0.05)
    if not value:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")
    return value
