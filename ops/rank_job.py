"""One short program on every rank through mlx.launch, beside the engine: a spread, a link check.

It starts as the engine is started (the configured BACKEND, HOSTFILE or HOSTS, the settings set in our
environment forwarded), but on the ports just above the engine's (RING_PORT..RING_PORT+n-1 stay free for an
engine that serves meanwhile). mlx.launch exits 0 whatever its ranks did, so the verdict is rank 0's result
file; a rank that fails makes mlx.launch end the others, and its exit line and its last words ("NAME rank N:
...") make the sentence. Once rank 0 prints the job's joined line, one byte quiets mlx.launch's stdin loop (the
workaround the engine's supervisor applies: ranks point fd 0 at /dev/null first).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from config import REPO_ROOT, Settings
from ipc.lifecycle import VICTIM_CAUSES
from ops.failures import describe_exit
from ops.layout import Layout
from ops.pidfile import PidFile
from ops.procs import poll
from ops.rank_env import env_args

LOCAL = {"127.0.0.1", "localhost", "::1"}
PORT_WAIT = 15.0  # seconds for the ports of a job that just ended (or was killed) to free
LAUNCHER_GRACE = 30.0  # seconds mlx.launch may take to end the other ranks after one failed
_NODE_EXIT = re.compile(r"Node with rank (\d+) (?:was (killed)|exited with code (-?\d+))")


class JobFailed(Exception):
    """The job ended without rank 0's result; the message is the sentence for the operator."""


def engine_holds_rdma(settings: Settings) -> bool:
    """A serving JACCL engine holds the RDMA devices: a second group opened beside it meets EBUSY."""
    return settings.BACKEND == "jaccl" and PidFile(Layout(settings).engine_pid).running() is not None


def engine_ports(settings: Settings, hosts: list[str]) -> int:
    """How many ports from RING_PORT the engine's ring takes: one per rank, or per address of a hostfile's host."""
    if not settings.HOSTFILE:
        return len(hosts)
    try:
        path = Path(settings.HOSTFILE).expanduser()
        doc = json.loads((path if path.is_absolute() else REPO_ROOT / path).read_text())
        entries = doc["hosts"] if isinstance(doc, dict) else doc
        return sum(max(1, len(h.get("ips") or [])) for h in entries)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return len(hosts)


def job_port(settings: Settings, n: int) -> int:
    """The first of the n ports a job takes: just above the engine's, or when those run out below the
    doorbell's (RING_PORT-1, Settings.doorbell_port)."""
    if settings.RING_PORT + 2 * n - 1 <= 65535:
        return settings.RING_PORT + n
    return settings.doorbell_port - n


def _ports_free(first: int, n: int) -> bool:
    for port in range(first, first + n):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


@dataclass
class Heard:
    """What the launcher's output told us: ranks that exited, and each rank's last line of its own."""

    exits: dict[int, int | None] = field(default_factory=dict)  # rank -> exit code (None: ended by mlx.launch)
    last_words: dict[int, str] = field(default_factory=dict)
    joined: threading.Event = field(default_factory=threading.Event)


@dataclass
class RankJob:
    """`python -m MODULE ARGS --result PATH` on every rank; run() returns rank 0's result file's bytes."""

    settings: Settings
    hosts: list[str]  # by rank, for messages
    name: str  # "spread": the ranks' last words start "spread rank N: "
    module: str
    args: list[str]
    result_path: Path
    joined_line: str  # what rank 0 prints once every rank joined
    what: str = ""  # the job in a sentence ("the link check failed"); name when empty
    env: dict[str, str] = field(default_factory=dict)  # set on every rank
    heard: Heard = field(default_factory=Heard)

    def command(self, port: int) -> list[str]:
        s = self.settings
        py = sys.executable
        cmd = [str(Path(py).parent / "mlx.launch"), "--backend", s.BACKEND, "--starting-port", str(port),
               "--cwd", str(REPO_ROOT)]
        cmd += ["--hostfile", s.HOSTFILE] if s.HOSTFILE else ["--hosts", ",".join(self.hosts)]
        # remote ranks do not inherit our environment: forward what was set in it, as the engine's start does
        cmd += env_args(s)  # the test hooks too, under MCS_TEST_HOOKS=1
        for key, value in self.env.items():
            cmd += ["--env", f"{key}={value}"]
        return [*cmd, "--", py, "-m", self.module, *self.args, "--result", str(self.result_path)]

    def run(self) -> bytes:
        """Rank 0's result; raises JobFailed with the sentence to print."""
        n = engine_ports(self.settings, self.hosts)
        port = job_port(self.settings, n)
        if (self.settings.BACKEND == "ring" and all(h in LOCAL for h in self.hosts)
                and not poll(lambda: _ports_free(port, n), PORT_WAIT, 0.2)):
            raise JobFailed(f"ports {port} to {port + n - 1} on this host stay in use, and the {self.name}'s {n} "
                            "local ranks need them (the engine's are RING_PORT and up, the "
                            f"{self.name}'s just above): stop what uses them or set RING_PORT to another free range")
        self.result_path.parent.mkdir(parents=True, exist_ok=True)
        self.result_path.unlink(missing_ok=True)
        popen = subprocess.Popen(self.command(port), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        relay = threading.Thread(target=self.relay, args=(popen,), name=f"{self.name}-relay", daemon=True)
        relay.start()
        try:
            self.wait(popen)
        finally:
            if popen.poll() is None:
                popen.kill()
                popen.wait()
            relay.join(timeout=5)
            for pipe in (popen.stdin, popen.stdout):
                if pipe is not None:
                    pipe.close()
        try:
            return self.result_path.read_bytes()
        except OSError:
            raise JobFailed(self.why_no_result()) from None

    def relay(self, popen: subprocess.Popen) -> None:
        """The ranks' output to our stderr; once every rank joined, the byte that quiets mlx.launch."""
        assert popen.stdout is not None and popen.stdin is not None
        last_words = re.compile(rf"^{re.escape(self.name)} rank (\d+): (.*)")
        for raw in iter(popen.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            print(line, file=sys.stderr, flush=True)
            if m := _NODE_EXIT.search(line):
                self.heard.exits[int(m.group(1))] = None if m.group(2) else int(m.group(3))
            elif m := last_words.match(line):
                self.heard.last_words[int(m.group(1))] = m.group(2)
            elif line.strip() == self.joined_line and not self.heard.joined.is_set():
                self.heard.joined.set()
                try:
                    popen.stdin.write(b"x")
                    popen.stdin.flush()
                except OSError:
                    pass

    def wait(self, popen: subprocess.Popen) -> None:
        """Until mlx.launch exits: the ranks bound their own waits; once one failed, mlx.launch gets
        LAUNCHER_GRACE to end the others before it is killed."""
        failed_at = None
        while popen.poll() is None:
            if failed_at is None and any(code != 0 for code in self.heard.exits.values()):
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > LAUNCHER_GRACE:
                return
            time.sleep(0.2)

    def why_no_result(self) -> str:
        """The sentence for a job that ended without rank 0's result: the rank that failed first, in its
        own words (a rank that ended because another one did, or that mlx.launch ended, is not the culprit)."""
        failed = {r: code for r, code in self.heard.exits.items() if code != 0}
        if not failed:
            return f"the {self.what or self.name} ended without a result from rank 0 (its output is above)"
        culprits = [r for r in sorted(failed) if failed[r] is not None and failed[r] not in VICTIM_CAUSES]
        r = (culprits or sorted(failed))[0]
        host = self.hosts[r] if r < len(self.hosts) else "?"
        words = self.heard.last_words.get(r)
        return f"the {self.what or self.name} failed: rank {r} ({host}) {describe_exit(failed[r])}" + (f": {words}" if words else "")

