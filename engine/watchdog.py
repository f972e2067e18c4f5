"""Ends this rank when the step loop stops making progress, so no rank waits forever.

A rank stuck in a collective (its peer died or froze) cannot notice by itself: the
collective busy-waits in C++. This thread watches the loop's heartbeat from outside.
Rank 0 also watches the supervisor that started it (ops/supervisor.py): an engine whose
supervisor was killed would serve on with no one to restart it or end it on a rank failure,
and with its output going nowhere, so rank 0 stops it (drain, then exit) instead.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from ipc.lifecycle import SUPERVISOR_ENV, ExitCause

log = logging.getLogger(__name__)

EXIT_STALLED = ExitCause.STALLED
LAST_WORDS_SECONDS = 2.0  # what logging the CRITICAL line may take before the exit happens anyway
SUPERVISOR_CHECK_EVERY = 2.0  # seconds


def process_gone(pid: int) -> bool:
    """True once pid has exited (a zombie waiting to be reaped counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        pass
    try:  # no /proc (macOS)
        out = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return not out.strip() or out.strip().startswith("Z")


def supervisor_pid(environ=os.environ) -> int | None:
    """The pid of this engine's supervisor when it runs on this host, else None."""
    host, _, pid = environ.get(SUPERVISOR_ENV, "").partition(" ")
    return int(pid) if pid.isdigit() and host == socket.gethostname() else None


class Watchdog:
    def __init__(self, timeout: float, rank: int):
        self.timeout = timeout
        self.rank = rank
        self.phase = "starting"
        self.last = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
        # Rank 0 ends the engine when its supervisor is gone; the other ranks then follow it.
        self.supervisor = supervisor_pid() if rank == 0 else None
        self._next_supervisor_check = 0.0

    def start(self) -> None:
        self._thread.start()

    def beat(self, phase: str) -> None:
        """Record progress; `phase` names what the loop is about to do (shown if it stalls)."""
        self.last = time.monotonic()
        self.phase = phase

    def age(self) -> float:
        return time.monotonic() - self.last

    def _run(self) -> None:
        while True:
            time.sleep(min(1.0, self.timeout / 4))
            self._check_supervisor()
            age = self.age()
            if age > self.timeout:
                # Exit even if logging blocks (a handler lock held by the stuck thread, a full pipe).
                deadline = threading.Timer(LAST_WORDS_SECONDS, os._exit, args=(EXIT_STALLED,))
                deadline.daemon = True
                deadline.start()
                log.critical("rank %d: no progress for %.1f s while %s (WATCHDOG_TIMEOUT=%g s): a peer rank "
                             "is dead or frozen; ending this rank", self.rank, age, self.phase, self.timeout)
                logging.shutdown()
                os._exit(EXIT_STALLED)

    def _check_supervisor(self) -> None:
        if self.supervisor is None or time.monotonic() < self._next_supervisor_check:
            return
        self._next_supervisor_check = time.monotonic() + SUPERVISOR_CHECK_EVERY
        if process_gone(self.supervisor):
            log.critical("rank %d: the engine's supervisor (pid %d) is gone, so nothing would restart or end this "
                         "engine on a failure; stopping it (./launch.sh start or restart-engine starts it again)",
                         self.rank, self.supervisor)
            self.supervisor = None
            os.kill(os.getpid(), signal.SIGTERM)  # the engine's own stop: drain, then exit
