"""Pid files and the launch lock, as gunicorn keeps them: atomic writes, a stale check, a refused
second start, and only our own file unlinked.

A live pid proves nothing: pids are reused. So a file records its process's start time next to the
pid, and a pid that now belongs to a process started at another time is a stale file: removed, never
signalled. A file from an older launch.sh (the pid alone) is checked by what the process runs instead.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ops.layout import say
from ops.procs import Unreadable, command_line, group_alive, group_members, pid_exists, process_start, stop_group

# What the processes of each file run, by the file name's first word (engine.pid, api.pid,
# api.draining.N, launch.lock): the check for a file without a start time, and for a group whose
# leader is gone (its start time cannot be read any more).
COMMANDS = {
    "engine": ("-m ops.supervisor", "-m engine", "mlx.launch"),
    "api": ("-m api",),
    "launch": ("-m ops", "launch.sh"),
}

# The largest pid any system hands out (pid_t is 32 bits); a larger number is no pid but a damaged file.
PID_MAX = 2**31 - 1


@dataclass(frozen=True)
class Record:
    """What a pid file holds: the pid, the process's start time, and since when it was told to stop. An
    API's also holds where it listens and its own API_DRAIN_TIMEOUT: a later command may run with others."""

    pid: int
    start: str | None = None  # process_start(pid) when written; None in a file from an older launch.sh
    stopping_since: float | None = None  # time.time() of the TERM that made a replaced API drain
    listen: str | None = None  # an API's API_HOST:API_PORT when it started
    drain: float | None = None  # an API's API_DRAIN_TIMEOUT when it started
    handover_since: float | None = None  # time.time() as a restart-api began handing this API over

    @property
    def handing_over(self) -> bool:
        """A replaced API's record written mid hand-over: not yet told to stop. The marker says so whatever
        the file held before; a file with a start time and no marker is a hand-over of an earlier version."""
        return self.stopping_since is None and (self.handover_since is not None or self.start is not None)

    def text(self) -> str:
        lines = [str(self.pid)]
        if self.start is not None:
            lines.append(f"start {self.start}")
        if self.stopping_since is not None:
            lines.append(f"stopping-since {self.stopping_since:.3f}")
        if self.listen is not None:
            lines.append(f"listen {self.listen}")
        if self.drain is not None:
            lines.append(f"drain-timeout {self.drain!r}")
        if self.handover_since is not None:
            lines.append(f"handover-since {self.handover_since:.3f}")
        return "\n".join(lines) + "\n"

    @classmethod
    def parse(cls, text: str) -> Record | None:
        lines = text.strip().splitlines()
        first = lines[0].strip() if lines else ""
        if not (first.isascii() and first.isdigit()) or len(first) > 10 or int(first) > PID_MAX:
            return None
        fields = dict(line.strip().partition(" ")[::2] for line in lines[1:])
        return cls(int(first), fields.get("start") or None, _number(fields.get("stopping-since")),
                   fields.get("listen") or None, _number(fields.get("drain-timeout")),
                   _number(fields.get("handover-since")))


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


# What a shell wraps around a word: mlx.launch's ssh command reads `cmd=(... -m engine); exec "${cmd[@]}"`.
SHELL_PUNCTUATION = "()[]{};&|<>'\"`"


def runs_one_of(command: str, patterns: tuple[str, ...]) -> bool:
    """True when command holds one of patterns as whole words (a path's last part counts as the word, and
    shell punctuation around a word does not count)."""
    words = [w.strip(SHELL_PUNCTUATION) for w in command.split()]
    for pattern in patterns:
        want = pattern.split()
        for i in range(len(words) - len(want) + 1):
            if all(w == p or w.endswith("/" + p) for w, p in zip(words[i:], want)):
                return True
    return False


def foreign(record: Record, patterns: tuple[str, ...] | None, *, group: bool = True) -> str:
    """Why the live pid (or group) of record is not the process that wrote it; "" when it is ours, or when
    ps could not tell (only proof of another process makes a file stale)."""
    pid = record.pid
    if pid <= 1 or (group and pid == os.getpgrp()):
        return f"pid {pid} can never be a process launch.sh started"
    try:
        return _foreign(record, patterns, group=group)
    except Unreadable:
        return ""


def _foreign(record: Record, patterns: tuple[str, ...] | None, *, group: bool) -> str:
    pid = record.pid
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
    commands = [command_line(member) or "" for member in group_members(pid, strict=True)]
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

    def judge(self) -> tuple[Record | None, int | None, str]:
        """(the record read, the recorded group while it runs and is ours, why not): why is "" when there is
        no file, and "not running" when the group is gone. The record is what drop() may remove."""
        record = self.record()
        if record is None:
            return None, None, "not a pid file" if self.path.exists() else ""
        if record.pid > 1 and not group_alive(record.pid):
            return record, None, "not running"
        why = foreign(record, self.patterns)
        return (record, None, why) if why else (record, record.pid, "")

    def check(self) -> tuple[int | None, str]:
        """(the recorded group, "") while it runs and is ours; else (None, why the file is stale), with why
        "" when there is no file, and "not running" when the group is gone."""
        return self.judge()[1:]

    def running(self) -> int | None:
        """The recorded group while any process of it runs and it is the one we started."""
        return self.check()[0]

    def clear_stale(self) -> int | None:
        """The recorded group while it runs; else the file, if any, is stale and goes."""
        record, pid, why = self.judge()
        if pid is None and self.path.exists():
            say(f"removing stale pid file {self.path} ({why})")
            self.drop(record)
        return pid

    def write(self, pid: int, **extra) -> None:
        try:
            start = process_start(pid)
        except Unreadable:
            start = None  # then judged by what it runs, as a file from an older launch.sh
        self.save(Record(pid, start, **extra))

    def save(self, record: Record) -> None:
        tmp = self.path.with_name(f"{self.path.name}.tmp.{os.getpid()}")
        tmp.write_text(record.text())
        os.replace(tmp, self.path)

    def mark_stopping(self) -> None:
        """Record that the process was told to stop now (a replaced API: status and ops watch its drain)."""
        record = self.record()
        if record is not None:
            self.save(replace(record, stopping_since=time.time(), handover_since=None))

    def unlink(self, pid: int | None = None) -> None:
        """Remove the file; with pid, only while it still records that pid (never another's)."""
        if pid is None or self.read() == pid:
            self.path.unlink(missing_ok=True)

    def drop(self, expected: Record | None) -> None:
        """Remove the file only while it holds exactly expected, the record judged stale: one rewritten
        meanwhile (a concurrent start's, status taking no lock) stays."""
        if self.record() == expected:
            self.path.unlink(missing_ok=True)

    def move_to(self, other: Path) -> PidFile:
        os.replace(self.path, other)
        return PidFile(other)


class Busy(Exception):
    """Another live launch.sh holds the lock: its pid (None when unreadable), and whether it holds the flock
    (then it provably runs; otherwise only its recorded pid says so)."""

    def __init__(self, pid: int | None, flocked: bool):
        super().__init__(pid)
        self.pid = pid
        self.flocked = flocked


# flock's errors on a filesystem that has no such locks (NFS without a lock daemon, some FUSE mounts).
NO_FLOCK = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP})


class Lock:
    """The launch lock: an flock on a file naming its holder, so two launch.sh never both take it, and a
    holder that died (even by SIGKILL) holds nothing. A file whose recorded holder still runs as a launch.sh
    but holds no flock (a launch.sh that takes the lock without one) is busy too. Where the filesystem has
    no flock the file alone is the lock, created whole by a link, as older launch.sh took it."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.fd: int | None = None
        self.linked = False

    @property
    def held(self) -> bool:
        return self.fd is not None or self.linked

    def acquire(self) -> None:
        if self.path.is_dir():  # the lock as a folder, from an older launch.sh
            shutil.rmtree(self.path, ignore_errors=True)
        for _ in range(20):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in NO_FLOCK:
                    self._link()
                    return
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                record = PidFile(self.path).record()
                raise Busy(None if record is None else record.pid, True) from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # its holder removed it as we opened it: lock the file now in place
                os.close(fd)
                continue
            try:
                self._claim(fd)
            except BaseException:
                os.close(fd)
                raise
            self.fd = fd
            return
        raise OSError(f"cannot create the lock {self.path}")

    def _holder(self) -> Record | None:
        """The record of the lock file; Busy when it names a live launch.sh other than us (saying why a
        recorded pid that lives on is not a holder)."""
        record = PidFile(self.path).record()
        if record is not None and record.pid != os.getpid() and record.pid > 1 and pid_exists(record.pid):
            why = foreign(record, COMMANDS["launch"], group=False)
            if not why:
                raise Busy(record.pid, False)
            say(f"removing stale lock {self.path} ({why})")
        return record

    @staticmethod
    def _ours() -> Record:
        try:
            start = process_start(os.getpid())
        except Unreadable:
            start = None
        return Record(os.getpid(), start)

    def _claim(self, fd: int) -> None:
        """Holding the flock: Busy when the recorded holder is a live launch.sh; else write ourselves in."""
        self._holder()
        os.ftruncate(fd, 0)
        os.pwrite(fd, self._ours().text().encode(), 0)

    def _link(self) -> None:
        """Without flock: link a file naming us into place; one already there is busy while its holder is a
        live launch.sh, else stale and removed (only as read, never one another launch.sh just linked)."""
        tmp = self.path.with_name(f"{self.path.name}.tmp.{os.getpid()}")
        tmp.write_text(self._ours().text())  # written aside, then linked: no one reads a lock without its pid
        try:
            for _ in range(20):
                try:
                    os.link(tmp, self.path)
                except FileExistsError:
                    PidFile(self.path).drop(self._holder())
                    continue
                self.linked = True
                return
        finally:
            tmp.unlink(missing_ok=True)
        raise OSError(f"cannot create the lock {self.path}")

    def release(self) -> None:
        if self.fd is not None:
            # Removed while still locked: whoever opened it meanwhile finds it gone and opens the new one.
            self.path.unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = None
        if self.linked:
            PidFile(self.path).unlink(os.getpid())
            self.linked = False


def stop_recorded(name: str, pids: PidFile, timeout: float, *, quiet: bool = False) -> None:
    """TERM the recorded group, wait up to timeout, then KILL it; drop the pid file. A group that is
    not the one we started is never signalled."""
    record, pid, why = pids.judge()
    if pid is None:
        if why and why != "not running":
            say(f"{name}: not signalling anything: the pid file {pids.path} is stale ({why}); removing it")
        elif why and not quiet:
            say(f"{name} was not running (removing stale pid file {pids.path})")
        pids.drop(record)
        return
    say(f"stopping {name} (process group {pid})")

    def killing(left: dict[int, str]) -> None:
        say(f"{name} still running after {timeout:g}s: sending SIGKILL to process group {pid}")

    if not stop_group(pid, timeout, on_kill=killing):
        # Not proven gone (a process stuck in the kernel, or a ps that fails): the file keeps naming it.
        say(f"warning: process group {pid} survived SIGKILL, or ps cannot tell; {pids.path} stays")
        return
    pids.unlink(pid)
