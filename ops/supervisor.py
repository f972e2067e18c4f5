"""`python -m ops.supervisor -- CMD...`: run the engine, end all of it when one rank fails.

`launch.sh start` starts the engine (mlx.launch, or one rank) through this small process, the
leader of the engine's process group. It relays the engine's output, learns the ranks from rank
0's Info, and when a rank dies or freezes, or rank 0 stops answering, it ends every process of
the group (mlx.launch alone waits forever for a frozen rank), records which rank failed in
RUN_DIR/engine.state.json for `launch.sh status`, and with ENGINE_RESTART=always starts the
engine again after a backoff. It imports no MLX.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec

from config import ConfigError, Settings, load_settings
from ipc.lifecycle import SUPERVISOR_ENV, VICTIM_CAUSES
from ipc.messages import Info
from ops.failures import Exit, Failure, Observed, blame, jaccl_busy
from ops.probe import drop_stale_socket, engine_info
from ops.procs import group_members, poll, stop_group
from ops.state import EngineState, LastFailure, state_path, write_state

log = logging.getLogger("ops.supervisor")

PROBE_EVERY = 1.0  # seconds between probes of rank 0 once it serves
PROBE_TIMEOUT = 2.0
# Seconds from TERM to KILL when ending a failed engine: ranks stuck in a collective cannot act
# on TERM anyway, but a rank 0 that can still tell its clients goodbye gets the chance.
END_GRACE = 1.0
# Seconds to wait for the culprit's exit line after a victim's: mlx.launch relays it a moment later,
# longer on a loaded machine. A stopped (frozen) rank never exits, so then nobody waits.
SETTLE = 3.0
BACKOFF_FIRST, BACKOFF_MAX = 1.0, 30.0  # restart delays double from the first to the max
STABLE_AFTER = 60.0  # an engine that served this long resets the backoff


def probe(socket_path: Path) -> Info | None:
    """Rank 0's Info, or None when it does not answer in time."""
    return engine_info(socket_path, PROBE_TIMEOUT)


class Supervisor:
    def __init__(self, settings: Settings, cmd: list[str]):
        self.settings = settings
        self.cmd = cmd
        self.launcher = Path(cmd[0]).name == "mlx.launch"
        self.stopping = False
        self.pgid = os.getpgrp()
        self.state_path = state_path(settings.run_dir)
        self.state = EngineState(pid=os.getpid(), restart=settings.ENGINE_RESTART)
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
            if not self.may_restart(failure, ever_ready):
                self.write_state("failed")
                return 1
            if not self.back_off(failure, failures):
                self.write_state("stopped")
                return 0
            failures += 1
            self.state.restarts += 1

    def may_restart(self, failure: Failure, ever_ready: bool) -> bool:
        if not ever_ready:
            log.critical("the engine failed before it ever served (%s); not restarting", failure.summary)
            return False
        if self.settings.ENGINE_RESTART != "always":
            log.critical("engine ended: %s (ENGINE_RESTART=never; ./launch.sh restart-engine starts it again)",
                         failure.summary)
            return False
        return True

    def back_off(self, failure: Failure, failures: int) -> bool:
        """Wait before the next restart; False when told to stop meanwhile."""
        delay = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** failures)
        log.critical("engine ended: %s; restarting it in %.0f s (ENGINE_RESTART=always, restart %d)",
                     failure.summary, delay, self.state.restarts + 1)
        self.write_state("restarting", next_restart_at=time.time() + delay)
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline and not self.stopping:
            time.sleep(0.1)
        return not self.stopping

    def spawn(self) -> None:
        self.observed = Observed()
        self.observed.size = self.settings.ranks if not self.settings.HOSTFILE else 0
        self.state.engine_pid, self.state.ranks = 0, []
        self.write_state("starting")
        # stdin: an open pipe that goes silent; one byte once rank 0 serves stops mlx.launch's
        # forwarding loop from spinning (see docs/operations.md, "The mlx.launch CPU-spin workaround").
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
        """None once rank 0 answers (or we are told to stop); else why it never will."""
        failure = None

        def going() -> bool:
            nonlocal failure
            failure = self.check_exits()
            return failure is None and not self.stopping

        limit = self.settings.ENGINE_START_TIMEOUT
        info = poll(lambda: probe(self.settings.socket_path), limit, 0.3, alive=going)
        if info is not None:
            self.ready(info)
            return None
        if failure is not None or self.stopping:
            return failure
        return Failure(f"rank 0 did not answer within ENGINE_START_TIMEOUT={limit:g} s", 0)

    def ready(self, info: Info) -> None:
        try:
            assert self.child is not None and self.child.stdin is not None
            self.child.stdin.write(b"x")
            self.child.stdin.flush()
        except OSError:
            pass  # one rank run directly has closed its stdin already
        self.observed.announce(info.rank_states, info.ranks)
        self.state.engine_pid, self.state.ranks = info.engine_pid, self.observed.seen()
        self.write_state("running")
        log.info("engine serving: rank 0 pid %d, %d rank(s)", info.engine_pid, info.ranks)

    def watch(self) -> Failure | None:
        """Until a rank fails (returned) or we are told to stop (None)."""
        last_ok = time.monotonic()
        limit = self.settings.WATCHDOG_TIMEOUT + PROBE_TIMEOUT
        stall_limit = 2 * self.settings.WATCHDOG_TIMEOUT + 5
        while not self.stopping:
            failure = self.check_exits()
            if failure is not None:
                return failure
            info = probe(self.settings.socket_path)
            if info is not None:
                last_ok = time.monotonic()
                if self.observed.announce(info.rank_states, info.ranks):
                    self.state.ranks = self.observed.seen()
                    self.write_state("running")
                if info.last_step_age > stall_limit:
                    # The rank's own watchdog should have ended it long ago; do it from outside.
                    return self.blame([], f"made no progress for {info.last_step_age:.0f} s and its watchdog "
                                          "did not end it")
            elif self.stopping:
                break
            elif time.monotonic() - last_ok > limit:
                failure = self.check_exits()
                return failure or self.blame([], f"rank 0 stopped answering on {self.settings.socket_path} for "
                                                 f"{time.monotonic() - last_ok:.0f} s")
            time.sleep(PROBE_EVERY)
        return None

    def check_exits(self) -> Failure | None:
        """A failure once any rank (or the launcher itself) has exited."""
        assert self.child is not None
        code = self.child.poll()
        if code is not None and self._relay is not None:
            self._relay.join(timeout=2)  # the launcher's last words name the ranks that exited
        exits = self._exits()
        if exits and all(c in VICTIM_CAUSES for _, c in exits):
            # A rank ended because of another one; the culprit's own exit may be a moment behind.
            deadline = time.monotonic() + SETTLE
            while time.monotonic() < deadline and all(c in VICTIM_CAUSES for _, c in exits):
                if "T" in group_members(self.pgid).values():
                    break
                time.sleep(0.1)
                exits = self._exits()
        if exits:
            return self.blame(exits, "")
        if code is not None:
            if self.launcher:
                return Failure(f"mlx.launch exited with code {code}", None)
            return self.blame([(0, code)], "")
        return None

    def _exits(self) -> list[Exit]:
        return self.observed.exited()

    def blame(self, exits: list[Exit], why: str) -> Failure:
        failure = blame(self.observed, exits, why, self.pgid)
        if self.observed.busy and self.settings.BACKEND == "jaccl":
            failure.hint = jaccl_busy(self.settings.JACCL_COOLDOWN)
        return failure

    # -- ending processes -------------------------------------------------------------------
    def end(self, failure: Failure) -> None:
        """End every process of the failed engine: TERM, a short grace, then KILL."""
        t0 = time.monotonic()
        log.critical("engine failure: %s%s; ending every rank%s", failure.summary,
                     f" (last words: {failure.detail})" if failure.detail else "",
                     f". {failure.hint}" if failure.hint else "")
        self.state.last_failure = LastFailure(time=time.time(), summary=failure.summary, rank=failure.rank,
                                              detail=failure.detail, hint=failure.hint)
        self.end_members(END_GRACE)
        self._reap()
        # A killed rank 0 cannot unlink its socket; one that still answers belongs to another engine.
        drop_stale_socket(self.settings.socket_path)
        log.info("every process of the failed engine is gone (%.1f s)", time.monotonic() - t0)

    def stop(self) -> None:
        """Asked to stop: the ranks drain (DRAIN_TIMEOUT) and exit; whatever is left then is killed."""
        log.info("stopping the engine")
        self.write_state("stopping")
        self.end_members(self.settings.DRAIN_TIMEOUT + 3)
        self._reap()
        self.write_state("stopped")

    def end_members(self, grace: float) -> None:
        def killing(left: dict[int, str]) -> None:
            log.warning("killing %d process(es) still running after %.0f s: %s", len(left), grace,
                        ", ".join(map(str, left)))

        stop_group(self.pgid, grace, spare=[os.getpid()], on_kill=killing)

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

    # -- state for launch.sh status -----------------------------------------------------------
    def write_state(self, state: str, **more) -> None:
        self.state = msgspec.structs.replace(self.state, **{"state": state, "next_restart_at": None, **more})
        try:
            write_state(self.state_path, self.state)
        except OSError as exc:
            log.warning("cannot write %s: %s", self.state_path, exc)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print("usage: python -m ops.supervisor -- COMMAND [ARGS...]", file=sys.stderr)
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
        sup.end_members(END_GRACE)
        sup.write_state("failed")
        return 1


if __name__ == "__main__":
    sys.exit(main())
