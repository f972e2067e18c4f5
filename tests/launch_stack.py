"""launch.sh under test: its own folders and ports, and a check that stop leaves nothing behind.

Used by the fault tests that go through launch.sh (and so through ops/supervisor.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from ops.pidfile import PidFile
from ops.procs import free_ring_port, processes
from tests.harness import MODEL_CACHE, REPO, free_port, short_dir, wait_for


def live_processes() -> dict[int, int]:
    """pid -> process group of every process that is not a zombie."""
    return {r.pid: r.pgid for r in processes()}


class Launch:
    """launch.sh with its own folders and ports; stop() leaves nothing behind."""

    def __init__(self, **settings: str):
        self.root = short_dir("mcsl-")
        (self.root / "empty.env").touch()
        self.api_port = free_port()
        self.env = {
            **os.environ,
            "ENV_FILE": str(self.root / "empty.env"),
            "RUN_DIR": str(self.root / "run"),
            "LOG_DIR": str(self.root / "logs"),
            "MODEL_CACHE_DIR": str(MODEL_CACHE),
            "MODEL": "demo-tiny",  # the fast random-weight demo, unless a test names another
            "API_HOST": "127.0.0.1",
            "API_PORT": str(self.api_port),
            "RING_PORT": str(free_ring_port(2)),
            "HOSTS": "127.0.0.1",
            **settings,
        }
        self.url = f"http://127.0.0.1:{self.api_port}"
        self.groups: set[int] = set()

    def run(self, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
        """launch.sh args; env: settings of this command only."""
        return subprocess.run([str(REPO / "launch.sh"), *args], env={**self.env, **env}, capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def start(self) -> None:
        r = self.run("start")
        assert r.returncode == 0, r.stdout + r.stderr + self.log_tail()
        for name in ("engine", "api"):
            self.groups.add(self.group(name))

    def state(self) -> dict:
        return json.loads((self.root / "run" / "engine.state.json").read_text())

    def rank_pids(self) -> dict[int, int]:
        """Once the supervisor has seen every rank join."""
        want = len(self.env["HOSTS"].split(","))
        ranks = wait_for(lambda: len(self.state()["ranks"]) == want and self.state()["ranks"], 10, "every rank")
        return {r["rank"]: r["pid"] for r in ranks}

    def group(self, name: str) -> int:
        pid = PidFile(self.root / "run" / f"{name}.pid").read()
        assert pid is not None, f"no {name}.pid"
        return pid

    def members(self) -> set[int]:
        return {pid for pid, group in live_processes().items() if group in self.groups}

    def log_tail(self, n: int = 40, name: str = "engine") -> str:
        try:
            return "\n".join((self.root / "logs" / f"{name}.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return f"(no {name} log)"

    def stop(self) -> None:
        r = self.run("stop", timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert not self.members(), "processes left after launch.sh stop"
        if not os.environ.get("KEEP_TEST_DIRS"):  # set it to read the logs of a failed test
            shutil.rmtree(self.root, ignore_errors=True)


def gone(pids) -> bool:
    alive = live_processes()
    return not any(pid in alive for pid in pids)
