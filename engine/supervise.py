"""`python -m engine.supervise -- CMD...`: run the engine, end all of it when one rank fails.

launch.sh starts the engine (mlx.launch, or one rank) through this small process, the leader
of the engine's process group. It relays the engine's output, learns the ranks from their
"joined" lines, and when a rank dies or freezes, or rank 0 stops answering, it ends every
process of the group (mlx.launch alone waits forever for a frozen rank), records which rank
failed in RUN_DIR/engine.state.json for `launch.sh status`, and with ENGINE_RESTART=always
starts the engine again after a backoff. It imports no MLX.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from config import ConfigError, Settings, load_settings
from engine.watchdog import EXIT_STALLED, SUPERVISOR_ENV
from ipc.connection import EngineUnavailable
from ipc.framing import ConnectionClosed, FrameError
from ipc.probe import fetch_info

log = logging.getLogger("engine.supervise")

PROBE_EVERY = 1.0  # seconds between probes of rank 0 once it serves
PROBE_TIMEOUT = 2.0
# Seconds from TERM to KILL when ending a failed engine: ranks stuck in a collective cannot act
# on TERM anyway, but a rank 0 that can still tell its clients goodbye gets the chance.
END_GRACE = 1.0
SETTLE = 0.5  # seconds to wait for the culprit's exit line after a victim's
BACKOFF_FIRST, BACKOFF_MAX = 1.0, 30.0  # restart delays double from the first to the max
STABLE_AFTER = 60.0  # an engine that served this long resets the backoff
EXIT_PEER_LOST = 4  # engine/__main__.py: a collective lost its peer
VICTIM_EXITS = {EXIT_STALLED, EXIT_PEER_LOST}  # codes of ranks ended because another rank failed

_JOINED = re.compile(r"rank (\d+) of (\d+) joined: .*, pid (\d+), host (\S+)")
_NODE_EXIT = re.compile(r"Node with rank (\d+) (?:was (killed)|exited with code (-?\d+))")
_CRITICAL = re.compile(r"\brank(\d+) CRITICAL \S+: (.*)")


@dataclass
class RankInfo:
    pid: int
    host: str


@dataclass
class Observed:
    """What the engine's output told us; written by the relay thread, read by the main loop."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    size: int = 0
    ranks: dict[int, RankInfo] = field(default_factory=dict)
    exits: list[tuple[int, int | None]] = field(default_factory=list)  # (rank, code); None: killed by the launcher
    last_words: dict[int, str] = field(default_factory=dict)

    def read(self, line: str) -> None:
        if m := _JOINED.search(line):
            with self.lock:
                self.size = int(m.group(2))
                self.ranks[int(m.group(1))] = RankInfo(int(m.group(3)), m.group(4))
        elif m := _NODE_EXIT.search(line):
            with self.lock:
                self.exits.append((int(m.group(1)), None if m.group(2) else int(m.group(3))))
        elif m := _CRITICAL.search(line):
            with self.lock:
                self.last_words.setdefault(int(m.group(1)), m.group(2).strip())


@dataclass
class Failure:
    """Which rank failed and how, in words for the log and `launch.sh status`."""

    summary: str
    rank: int | None
    detail: str = ""


def group_members(pgid: int) -> dict[int, str]:
    """Live processes of process group pgid (this one excluded), pid -> state letter."""
    try:
        ps = subprocess.Popen(["ps", "-A", "-o", "pid=", "-o", "pgid=", "-o", "stat="], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
        out, _ = ps.communicate(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    members = {}
    for row in out.splitlines():
        parts = row.split()
        if len(parts) < 3 or parts[1] != str(pgid) or parts[2].startswith("Z"):
            continue
        if int(parts[0]) not in (os.getpid(), ps.pid):  # ps runs in our group too
            members[int(parts[0])] = parts[2][0]
    return members


def signal_members(pids, sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def describe_exit(code: int | None) -> str:
    if code is None:
        return "was killed by mlx.launch"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    if code == EXIT_STALLED:
        return "was ended by its watchdog (no progress)"
    if code == EXIT_PEER_LOST:
        return "lost its connection to a peer rank"
    return f"exited with code {code}"


def probe(socket_path: Path) -> dict | None:
    """Rank 0's Info as a dict, or None when it does not answer in time."""
    try:
        info = anyio.run(fetch_info, str(socket_path), PROBE_TIMEOUT)
    except (EngineUnavailable, ConnectionClosed, FrameError, TimeoutError, OSError):
        return None
    return {"engine_pid": info.engine_pid, "ranks": info.ranks, "last_step_age": info.last_step_age}


class Supervisor:
    def __init__(self, settings: Settings, cmd: list[str]):
        self.settings = settings
        self.cmd = cmd
        self.launcher = Path(cmd[0]).name == "mlx.launch"
        self.stopping = False
        self.pgid = os.getpgrp()
        self.state_path = settings.run_dir / "engine.state.json"
        self.state: dict = {"pid": os.getpid(), "state": "starting", "restart": settings.ENGINE_RESTART,
                            "restarts": 0, "engine_pid": 0, "ranks": [], "last_failure": None}
        self.child: subprocess.Popen | None = None
        self.observed = Observed()
        self._relay: threading.Thread | None = None

    # -- signals (never log in a handler) -------------------------------------------------
    def on_signal(self, signum, frame) -> None:
        self.stopping = True

    # -- the outer loop -------------------------------------------------------------------
    def run(self) -> int:
        if probe(self.settings.socket_path) is not None:
            # Whatever answers now is not ours: never adopt it, nor later unlink its socket.
            log.error("another engine already answers on %s; stop it first", self.settings.socket_path)
            return 1
        failures = 0
        ever_ready = False
        while True:
            self.spawn()
            started = time.monotonic()
            failure = self.wait_ready()
            if failure is None and not self.stopping:
                ever_ready = True
                failure = self.watch()
            if self.stopping:
                self.stop()
                return 0
            assert failure is not None
            self.end(failure)
            if time.monotonic() - started >= STABLE_AFTER:
                failures = 0
            if not ever_ready:
                log.critical("the engine failed before it ever served (%s); not restarting", failure.summary)
                self.write_state("failed")
                return 1
            if self.settings.ENGINE_RESTART != "always":
                log.critical("engine ended: %s (ENGINE_RESTART=never; ./launch.sh restart-engine starts it again)",
                             failure.summary)
                self.write_state("failed")
                return 1
            delay = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** failures)
            failures += 1
            log.critical("engine ended: %s; restarting it in %.0f s (ENGINE_RESTART=always, restart %d)",
                         failure.summary, delay, self.state["restarts"] + 1)
            self.write_state("restarting", next_restart_at=time.time() + delay)
            if not self.sleep(delay):
                self.write_state("stopped")
                return 0
            self.state["restarts"] += 1

    def spawn(self) -> None:
        self.observed = Observed()
        self.state.update(engine_pid=0, ranks=[])
        self.write_state("starting")
        # stdin: an open pipe that goes silent; one byte once rank 0 serves stops mlx.launch's
        # forwarding loop from spinning (see README, "The mlx.launch CPU-spin workaround").
        # Rank 0 stops the engine if we die: no engine runs on unsupervised (engine/watchdog.py).
        env = {**os.environ, SUPERVISOR_ENV: f"{socket.gethostname()} {os.getpid()}"}
        self.child = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, env=env)
        self._relay = threading.Thread(target=self.relay, args=(self.child.stdout,), name="relay", daemon=True)
        self._relay.start()
        log.info("started the engine (pid %d): %s", self.child.pid, " ".join(self.cmd))

    def relay(self, pipe) -> None:
        """Copy the engine's output to ours (the engine log), reading the lines we care about."""
        out = sys.stderr.buffer
        for raw in iter(pipe.readline, b""):
            try:
                out.write(raw)
                out.flush()
            except OSError:
                pass
            self.observed.read(raw.decode(errors="replace"))
        pipe.close()

    def wait_ready(self) -> Failure | None:
        deadline = time.monotonic() + self.settings.ENGINE_START_TIMEOUT
        while not self.stopping:
            failure = self.check_exits()
            if failure is not None:
                return failure
            info = probe(self.settings.socket_path)
            if info is not None:
                self.ready(info)
                return None
            if time.monotonic() > deadline:
                limit = self.settings.ENGINE_START_TIMEOUT
                return Failure(f"rank 0 did not answer within ENGINE_START_TIMEOUT={limit:g} s", 0)
            time.sleep(0.3)
        return None

    def ready(self, info: dict) -> None:
        try:
            assert self.child is not None and self.child.stdin is not None
            self.child.stdin.write(b"x")
            self.child.stdin.flush()
        except OSError:
            pass  # one rank run directly has closed its stdin already
        self.state.update(engine_pid=info["engine_pid"], ranks=self._ranks())
        self.write_state("running")
        log.info("engine serving: rank 0 pid %d, %d rank(s)", info["engine_pid"], info["ranks"])

    def watch(self) -> Failure | None:
        """Until a rank fails (returned) or we are told to stop (None)."""
        last_ok = time.monotonic()
        limit = self.settings.WATCHDOG_TIMEOUT + PROBE_TIMEOUT
        stall_limit = 2 * self.settings.WATCHDOG_TIMEOUT + 5
        while not self.stopping:
            failure = self.check_exits()
            if failure is not None:
                return failure
            if len(self._ranks()) != len(self.state["ranks"]):  # a rank's "joined" line came after rank 0's
                self.state["ranks"] = self._ranks()
                self.write_state("running")
            info = probe(self.settings.socket_path)
            if info is not None:
                last_ok = time.monotonic()
                if info["last_step_age"] > stall_limit:
                    # The rank's own watchdog should have ended it long ago; do it from outside.
                    return self.blame([], f"made no progress for {info['last_step_age']:.0f} s and its watchdog "
                                          "did not end it")
            elif self.stopping:
                break
            elif time.monotonic() - last_ok > limit:
                failure = self.check_exits()
                return failure or self.blame([], f"rank 0 stopped answering on {self.settings.socket_path} for "
                                                 f"{time.monotonic() - last_ok:.0f} s")
            time.sleep(PROBE_EVERY)
        return None

    def _ranks(self) -> list[dict]:
        with self.observed.lock:
            return [{"rank": r, "pid": i.pid, "host": i.host} for r, i in sorted(self.observed.ranks.items())]

    def check_exits(self) -> Failure | None:
        """A failure once any rank (or the launcher itself) has exited."""
        assert self.child is not None
        code = self.child.poll()
        if code is not None and self._relay is not None:
            self._relay.join(timeout=2)  # the launcher's last words name the ranks that exited
        exits = self._exits()
        if exits and all(c in VICTIM_EXITS for _, c in exits):
            # A rank ended because of another one; the culprit's own exit may be a moment behind.
            deadline = time.monotonic() + SETTLE
            while time.monotonic() < deadline and all(c in VICTIM_EXITS for _, c in exits):
                time.sleep(0.1)
                exits = self._exits()
        if exits:
            return self.blame(exits, "")
        if code is not None:
            if self.launcher:
                return Failure(f"mlx.launch exited with code {code}", None)
            return self.blame([(0, code)], "")
        return None

    def _exits(self) -> list[tuple[int, int | None]]:
        with self.observed.lock:
            return list(self.observed.exits)

    def blame(self, exits: list[tuple[int, int | None]], why: str) -> Failure:
        """Name the failed rank: the first to exit for its own reasons, else the ones still running."""
        obs = self.observed
        with obs.lock:
            ranks, size, words = dict(obs.ranks), obs.size, dict(obs.last_words)
        for rank, code in exits:
            if code not in VICTIM_EXITS:
                return Failure(f"rank {rank}{self._where(ranks, rank)} {describe_exit(code)}", rank,
                               words.get(rank, ""))
        exited = {rank for rank, _ in exits}
        suspects = [r for r in range(max(size, 1)) if r not in exited]
        if exits and suspects:
            victim, code = exits[0]
            rank = suspects[0]
            state = ""
            info = ranks.get(rank)
            if info is not None:
                letter = group_members(self.pgid).get(info.pid)
                state = " (its process is stopped)" if letter == "T" else ""
            return Failure(f"rank {rank}{self._where(ranks, rank)} stopped responding{state}; rank {victim} "
                           f"{describe_exit(code)}", rank, words.get(victim, ""))
        if exits:
            rank, code = exits[0]
            return Failure(f"rank {rank}{self._where(ranks, rank)} {describe_exit(code)}", rank, words.get(rank, ""))
        return Failure(f"rank 0{self._where(ranks, 0)} {why}", 0, words.get(0, ""))

    @staticmethod
    def _where(ranks: dict[int, RankInfo], rank: int) -> str:
        info = ranks.get(rank)
        return f" (pid {info.pid} on {info.host})" if info else ""

    # -- ending processes -------------------------------------------------------------------
    def end(self, failure: Failure) -> None:
        """End every process of the failed engine: TERM, a short grace, then KILL."""
        t0 = time.monotonic()
        log.critical("engine failure: %s%s; ending every rank", failure.summary,
                     f" (last words: {failure.detail})" if failure.detail else "")
        self.state["last_failure"] = {"time": time.time(), "summary": failure.summary, "rank": failure.rank,
                                      "detail": failure.detail}
        self._end_members(END_GRACE)
        self._reap()
        self._drop_stale_socket()
        log.info("every process of the failed engine is gone (%.1f s)", time.monotonic() - t0)

    def stop(self) -> None:
        """Asked to stop: the ranks drain (DRAIN_TIMEOUT) and exit; whatever is left then is killed."""
        log.info("stopping the engine")
        self.write_state("stopping")
        self._end_members(self.settings.DRAIN_TIMEOUT + 3)
        self._reap()
        self.write_state("stopped")

    def _end_members(self, grace: float) -> None:
        members = group_members(self.pgid)
        # A stopped (frozen) process only acts on KILL.
        signal_members([pid for pid, state in members.items() if state == "T"], signal.SIGKILL)
        signal_members([pid for pid, state in members.items() if state != "T"], signal.SIGTERM)
        deadline = time.monotonic() + grace
        while (members := group_members(self.pgid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        if members:
            log.warning("killing %d process(es) still running after %.0f s: %s", len(members), grace,
                        ", ".join(map(str, members)))
            signal_members(members, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while group_members(self.pgid) and time.monotonic() < deadline:
                time.sleep(0.1)

    def _reap(self) -> None:
        if self.child is not None:
            try:
                self.child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            if self.child.stdin is not None:
                try:
                    self.child.stdin.close()
                except OSError:
                    pass
        if self._relay is not None:
            self._relay.join(timeout=2)

    def _drop_stale_socket(self) -> None:
        # A killed rank 0 cannot unlink its socket (a restarted one replaces it anyway); one that
        # still answers belongs to another engine and stays.
        if probe(self.settings.socket_path) is None:
            try:
                self.settings.socket_path.unlink()
            except OSError:
                pass

    def sleep(self, seconds: float) -> bool:
        """Sleep unless asked to stop; False when stopped."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.stopping:
                return False
            time.sleep(0.1)
        return not self.stopping

    # -- state for launch.sh status -----------------------------------------------------------
    def write_state(self, state: str, **more) -> None:
        self.state["next_restart_at"] = None
        self.state.update(state=state, **more)
        tmp = self.state_path.with_name(f".{self.state_path.name}.{os.getpid()}")
        try:
            tmp.write_text(json.dumps(self.state))
            os.replace(tmp, self.state_path)
        except OSError as exc:
            log.warning("cannot write %s: %s", self.state_path, exc)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print("usage: python -m engine.supervise -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    cmd = argv[argv.index("--") + 1 :]
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.LOG_LEVEL, stream=sys.stderr,
                        format="%(asctime)s supervisor %(levelname)s %(name)s: %(message)s")
    # Lead our own process group: ending "every process of the group" must never reach a caller.
    if os.getpgrp() != os.getpid():
        os.setpgid(0, 0)
    try:
        settings.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        print(f"RUN_DIR={settings.RUN_DIR}: cannot create the folder {settings.run_dir} ({exc.strerror or exc}); "
              "set RUN_DIR to a folder you can write to", file=sys.stderr)
        return 2
    sup = Supervisor(settings, cmd)
    signal.signal(signal.SIGTERM, sup.on_signal)
    signal.signal(signal.SIGINT, sup.on_signal)
    try:
        return sup.run()
    except Exception:
        # A bug here must not leave ranks running unwatched.
        log.exception("the supervisor failed; ending the engine")
        sup._end_members(END_GRACE)
        sup.write_state("failed")
        return 1


if __name__ == "__main__":
    sys.exit(main())
