"""Bounds every wait of a spreading (or link-checking) rank: a collective whose peer died or froze busy-waits
in C++ forever.

A thread watches a deadline the rank moves forward as it makes progress; past it, the rank prints one
line and exits with ExitCause.STALLED, and mlx.launch then ends the other ranks (it does on any rank's
non-zero exit). Rank 0 also ends the spread when the ops process that started it is gone.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

from config import ConfigError, Settings, load_settings
from engine.watchdog import process_gone
from ipc.lifecycle import ExitCause
from ipc.spread import PARENT_ENV

CHECK_EVERY = 0.5  # seconds


class Deadline:
    def __init__(self, rank: int, name: str = "spread"):
        self.rank, self.name = rank, name  # the rank's last words start "NAME rank N: " (ops/rank_job.py)
        self.phase = "starting"
        self.until = time.monotonic() + 3600
        parent = os.environ.get(PARENT_ENV, "") if rank == 0 else ""
        host, _, pid = parent.partition(" ")
        self.parent = int(pid) if pid.isdigit() and host == socket.gethostname() else None
        threading.Thread(target=self._run, name=f"{name}-deadline", daemon=True).start()

    def beat(self, phase: str, allowance: float) -> None:
        """The next wait (named by phase) may take up to allowance seconds."""
        self.phase = phase
        self.until = time.monotonic() + allowance

    def _run(self) -> None:
        while True:
            time.sleep(CHECK_EVERY)
            if self.parent is not None and process_gone(self.parent):
                self._end(f"the process that started the {self.name} (pid {self.parent}) is gone")
            late = time.monotonic() - self.until
            if late > 0:
                self._end(f"no progress while {self.phase} (past its deadline by {late:.0f} s): a peer rank is "
                          "dead or frozen")

    def _end(self, why: str) -> None:
        try:
            print(f"{self.name} rank {self.rank}: {why}; ending this rank", file=sys.stderr, flush=True)
        finally:
            os._exit(ExitCause.STALLED)


def start(name: str, join_seconds: float) -> tuple[Settings, Deadline] | int:
    """A rank's first steps (stdin to /dev/null, then its settings and its running deadline for joining the others);
    an ExitCause after one line when a setting is invalid."""
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # mlx.launch's forwarding loop spins on a rank's open stdin
    rank = int(os.environ.get("MLX_RANK", "0"))
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"{name} rank {rank}: configuration error: {exc}", file=sys.stderr, flush=True)
        return ExitCause.CONFIG
    deadline = Deadline(rank, name)
    deadline.beat(f"joining the other ranks over {settings.BACKEND}", join_seconds)
    return settings, deadline
