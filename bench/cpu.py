"""CPU accounting from /proc: per-process use (idle-CPU target) and how busy the whole host was.

The host is shared with other people's test runs; recording its busy fraction next to every
measurement tells a reader which numbers were taken on a quiet machine.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (all its threads), or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces or parentheses: split after its closing parenthesis.
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def thread_seconds(pid: int) -> dict[int, float]:
    """utime + stime of each live thread of a process: tid -> seconds (empty when the process is gone)."""
    out: dict[int, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue  # ended meanwhile
        fields = text[text.rindex(")") + 2 :].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def thread_comm(pid: int, tid: int) -> str:
    """The kernel's name of a thread (what prctl/pthread_setname_np set; else the program's name)."""
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return "?"


def command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(a.decode(errors="replace") for a in raw.split(b"\0") if a)


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            pass
    return sorted(set(out))


def descendants(pid: int) -> list[int]:
    out = []
    for c in children(pid):
        out += [c, *descendants(c)]
    return out


def idle_cpu(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """% of one core each process used over `seconds` (nothing else asked of it meanwhile)."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    t0 = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    out = {}
    for name, pid in pids.items():
        after = cpu_seconds(pid)
        if before[name] is None or after is None:
            out[name] = float("nan")
        else:
            out[name] = 100.0 * (after - before[name]) / wall
    return out


def _host_ticks() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields), idle


def _tree_seconds(pid: int) -> float:
    """CPU of a process, its live descendants and every child they have reaped."""
    total = 0.0
    for p in [pid, *descendants(pid)]:
        try:
            text = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        f = text[text.rindex(")") + 2 :].split()
        total += sum(int(x) for x in f[11:15]) / TICK  # utime stime cutime cstime
    return total


class HostLoad:
    """Cores busy with other people's work (the host minus this benchmark's process tree)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.total0, self.idle0 = _host_ticks()
        self.ours0 = _tree_seconds(os.getpid())

    def foreign_cores(self) -> float:
        total1, idle1 = _host_ticks()
        wall = time.monotonic() - self.t0
        total = total1 - self.total0
        if total <= 0 or wall <= 0:
            return 0.0
        busy = (os.cpu_count() or 1) * (1.0 - (idle1 - self.idle0) / total)
        ours = (_tree_seconds(os.getpid()) - self.ours0) / wall
        return max(0.0, busy - ours)


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def wait_quiet(threshold: float, max_wait: float, window: float = 1.0) -> tuple[float, float]:
    """Wait (at most max_wait s) until other processes use under `threshold` cores over one window.

    Returns (seconds waited, their load in the last window). Other people's work only ever
    slows a measurement down, so starting on a quiet host removes most of the noise.
    """
    t0 = time.monotonic()
    while True:
        probe = HostLoad()
        time.sleep(window)
        foreign = probe.foreign_cores()
        if foreign < threshold or time.monotonic() - t0 >= max_wait:
            return time.monotonic() - t0, foreign
