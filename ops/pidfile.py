"""Pid files and the launch lock, as gunicorn keeps them: atomic writes, a stale check, a refused
second start, and only our own file unlinked.

A live pid proves nothing: pids are reused. So a file records its process's start time next to the
pid, and a pid that now belongs to a process started at another time is a stale file: removed, never
signalled. A file from an older launch.sh (the pid alone) is checked by what the process runs instead.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ops.layout import say
from ops.procs import command_line, group_alive, group_members, pid_exists, process_start, stop_group

# What the processes of each file run, by the file name's first word (engine.pid, api.pid,
# api.draining.N, launch.lock): the check for a file without a start time, and for a group whose
# leader is gone (its start time cannot be read any more).
COMMANDS = {
    "engine": ("-m ops.supervisor", "-m engine", "mlx.launch"),
    "api": ("-m api",),
    "launch": ("-m ops", "launch.sh"),
}


@dataclass(frozen=True)
class Record:
    """What a pid file holds: the pid, the process's start time, and since when it was told to stop."""

    pid: int
    start: str | None = None  # process_start(pid) when written; None in a file from an older launch.sh
    stopping_since: float | None = None  # time.time() of the TERM that made a replaced API drain

    def text(self) -> str:
        lines = [str(self.pid)]
        if self.start is not None:
            lines.append(f"start {self.start}")
        if self.stopping_since is not None:
            lines.append(f"stopping-since {self.stopping_since:.3f}")
        return "\n".join(lines) + "\n"

    @classmethod
    def parse(cls, text: str) -> Record | None:
        lines = text.strip().splitlines()
        if not lines or not lines[0].strip().isdigit():
            return None
        fields = dict(line.strip().partition(" ")[::2] for line in lines[1:])
        try:
            since = float(fields["stopping-since"]) if "stopping-since" in fields else None
        except ValueError:
            since = None
        return cls(int(lines[0]), fields.get("start") or None, since)


def runs_one_of(command: str, patterns: tuple[str, ...]) -> bool:
    """True when command holds one of patterns as whole words (a path's last part counts as the word)."""
    words = command.split()
    for pattern in patterns:
        want = pattern.split()
        for i in range(len(words) - len(want) + 1):
            if all(w == p or w.endswith("/" + p) for w, p in zip(words[i:], want)):
                return True
    return False


def foreign(record: Record, patterns: tuple[str, ...] | None, *, group: bool = True) -> str:
    """Why the live pid (or group) of record is not the process that wrote it; "" when it is ours."""
    pid = record.pid
    if pid <= 1 or (group and pid == os.getpgrp()):
        return f"pid {pid} can never be a process launch.sh started"
    start = process_start(pid)
    if start is not None:
        if record.start is not None:
            return "" if start == record.start else f"pid {pid} is now another process (started at another time)"
        command = command_line(pid) or ""
        if patterns is None or runs_one_of(command, patterns):
            return ""
        return f"pid {pid} is now another program: {command[:120]}"
    if not group or patterns is None:
        return ""
    # The leader is gone but its group lives on: ours only while a member still runs what we started.
    commands = [command_line(member) or "" for member in group_members(pid)]
    if any(runs_one_of(c, patterns) for c in commands):
        return ""
    return f"process group {pid} now holds other programs: {'; '.join(c[:80] for c in commands)}"


class PidFile:
    """A file naming a process group we started (its leader's pid is the group id) and when it started."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.patterns = COMMANDS.get(self.path.name.split(".")[0])

    def record(self) -> Record | None:
        """What the file holds, or None when there is no well-formed file."""
        try:
            return Record.parse(self.path.read_text())
        except OSError:
            return None

    def read(self) -> int | None:
        """The recorded pid, or None when there is no well-formed file."""
        record = self.record()
        return None if record is None else record.pid

    def check(self) -> tuple[int | None, str]:
        """(the recorded group, "") while it runs and is ours; else (None, why the file is stale), with why
        "" when there is no file, and "not running" when the group is gone."""
        record = self.record()
        if record is None:
            return None, "not a pid file" if self.path.exists() else ""
        if record.pid > 1 and not group_alive(record.pid):
            return None, "not running"
        why = foreign(record, self.patterns)
        return (None, why) if why else (record.pid, "")

    def running(self) -> int | None:
        """The recorded group while any process of it runs and it is the one we started."""
        return self.check()[0]

    def clear_stale(self) -> int | None:
        """The recorded group while it runs; else the file, if any, is stale and goes."""
        pid, why = self.check()
        if pid is None and self.path.exists():
            say(f"removing stale pid file {self.path} ({why})")
            self.drop()
        return pid

    def write(self, pid: int, **extra) -> None:
        self.save(Record(pid, process_start(pid), **extra))

    def save(self, record: Record) -> None:
        tmp = self.path.with_name(f"{self.path.name}.tmp.{os.getpid()}")
        tmp.write_text(record.text())
        os.replace(tmp, self.path)

    def mark_stopping(self) -> None:
        """Record that the process was told to stop now (a replaced API: status and ops watch its drain)."""
        record = self.record()
        if record is not None:
            self.save(replace(record, stopping_since=time.time()))

    def unlink(self, pid: int | None = None) -> None:
        """Remove the file; with pid, only while it still records that pid (never another's)."""
        if pid is None or self.read() == pid:
            self.path.unlink(missing_ok=True)

    def drop(self) -> None:
        """Remove the file as read just now: one rewritten meanwhile (another start's) stays."""
        self.unlink(self.read())

    def move_to(self, other: Path) -> PidFile:
        os.replace(self.path, other)
        return PidFile(other)


class Busy(Exception):
    """Another live launch.sh holds the lock; its pid is the argument."""


class Lock:
    """A lock file naming its holder: a stale one (holder gone, or not a launch.sh) is taken over."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.held = False

    def acquire(self) -> None:
        if self.path.is_dir():  # the lock as a folder, from an older launch.sh
            shutil.rmtree(self.path, ignore_errors=True)
        # Written aside, then linked into place: no one ever reads a lock without its pid.
        tmp = self.path.with_name(f"{self.path.name}.tmp.{os.getpid()}")
        tmp.write_text(Record(os.getpid(), process_start(os.getpid())).text())
        try:
            for _ in range(2):
                try:
                    os.link(tmp, self.path)
                except FileExistsError:
                    self._take_over_stale()
                    continue
                self.held = True
                return
        finally:
            tmp.unlink(missing_ok=True)
        raise OSError(f"cannot create the lock {self.path}")

    def _take_over_stale(self) -> None:
        """Busy while a launch.sh holds the lock; else remove it (saying why when its pid lives on)."""
        holder = PidFile(self.path)
        record = holder.record()
        if record is not None and record.pid != os.getpid() and record.pid > 1 and pid_exists(record.pid):
            why = foreign(record, COMMANDS["launch"], group=False)
            if not why:
                raise Busy(record.pid)
            say(f"removing stale lock {self.path} ({why})")
        if record is None:
            self.path.unlink(missing_ok=True)
        else:
            holder.drop()

    def release(self) -> None:
        if self.held:
            PidFile(self.path).unlink(os.getpid())
            self.held = False


def stop_recorded(name: str, pids: PidFile, timeout: float, *, quiet: bool = False) -> None:
    """TERM the recorded group, wait up to timeout, then KILL it; drop the pid file. A group that is
    not the one we started is never signalled."""
    pid, why = pids.check()
    if pid is None:
        if why and why != "not running":
            say(f"{name}: not signalling anything: the pid file {pids.path} is stale ({why}); removing it")
        elif why and not quiet:
            say(f"{name} was not running (removing stale pid file {pids.path})")
        pids.drop()
        return
    say(f"stopping {name} (process group {pid})")

    def killing(left: dict[int, str]) -> None:
        say(f"{name} still running after {timeout:g}s: sending SIGKILL to process group {pid}")

    if not stop_group(pid, timeout, on_kill=killing):
        say(f"warning: process group {pid} survived SIGKILL")
    pids.unlink(pid)
