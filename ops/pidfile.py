"""Pid files and the launch lock, as gunicorn keeps them: atomic writes, a stale check with
kill -0, a refused second start, and only our own file unlinked."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ops.layout import say
from ops.procs import group_alive, pid_exists, stop_group


class PidFile:
    """A file holding the pid of a process group we started (its leader's pid is the group id)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def read(self) -> int | None:
        """The recorded pid, or None when there is no well-formed file."""
        try:
            text = self.path.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def running(self) -> int | None:
        """The recorded group while any process of it runs."""
        pid = self.read()
        return pid if pid is not None and group_alive(pid) else None

    def clear_stale(self) -> int | None:
        """The recorded group while it runs; else the file, if any, is stale and goes."""
        pid = self.running()
        if pid is None and self.path.exists():
            say(f"removing stale pid file {self.path}")
            self.path.unlink(missing_ok=True)
        return pid

    def write(self, pid: int) -> None:
        tmp = self.path.with_name(f"{self.path.name}.tmp.{os.getpid()}")
        tmp.write_text(f"{pid}\n")
        os.replace(tmp, self.path)

    def unlink(self, pid: int | None = None) -> None:
        """Remove the file; with pid, only while it still records that pid (never another's)."""
        if pid is None or self.read() == pid:
            self.path.unlink(missing_ok=True)

    def move_to(self, other: Path) -> PidFile:
        os.replace(self.path, other)
        return PidFile(other)


class Busy(Exception):
    """Another live process holds the lock; its pid is the argument."""


class Lock:
    """A lock file naming its holder: a stale one (holder gone) is taken over."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.held = False

    def acquire(self) -> None:
        if self.path.is_dir():  # the lock as a folder, from an older launch.sh
            shutil.rmtree(self.path, ignore_errors=True)
        # Written aside, then linked into place: no one ever reads a lock without its pid.
        tmp = self.path.with_name(f"{self.path.name}.tmp.{os.getpid()}")
        tmp.write_text(f"{os.getpid()}\n")
        try:
            for _ in range(2):
                try:
                    os.link(tmp, self.path)
                except FileExistsError:
                    owner = PidFile(self.path).read()
                    if owner is not None and owner != os.getpid() and pid_exists(owner):
                        raise Busy(owner) from None
                    self.path.unlink(missing_ok=True)
                    continue
                self.held = True
                return
        finally:
            tmp.unlink(missing_ok=True)
        raise OSError(f"cannot create the lock {self.path}")

    def release(self) -> None:
        if self.held:
            PidFile(self.path).unlink(os.getpid())
            self.held = False


def stop_recorded(name: str, pids: PidFile, timeout: float, *, quiet: bool = False) -> None:
    """TERM the recorded group, wait up to timeout, then KILL it; drop the pid file."""
    pid = pids.read()
    if pid is None:
        pids.path.unlink(missing_ok=True)
        return
    if group_alive(pid):
        say(f"stopping {name} (process group {pid})")

        def killing(left: dict[int, str]) -> None:
            say(f"{name} still running after {timeout:g}s: sending SIGKILL to process group {pid}")

        if not stop_group(pid, timeout, on_kill=killing):
            say(f"warning: process group {pid} survived SIGKILL")
    elif not quiet:
        say(f"{name} was not running (removing stale pid file {pids.path})")
    pids.unlink(pid)
