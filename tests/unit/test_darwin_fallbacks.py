"""The branches that run only on macOS, taken here by taking away what Linux has: /proc, /proc/meminfo, an
open-file limit above macOS's OPEN_MAX. Each asserts what a Mac would see."""

from __future__ import annotations

import resource
import subprocess

from engine import watchdog
from ipc import connection
from ops import procs


class NoProc:
    """A Path where no /proc exists, as on macOS."""

    def __init__(self, path: str) -> None:
        self.path = path

    def read_text(self) -> str:
        raise FileNotFoundError(self.path)

    def exists(self) -> bool:
        return False


def test_without_proc_a_process_start_is_ps_lstart(monkeypatch):
    asked = []
    monkeypatch.setattr(procs, "Path", NoProc)
    monkeypatch.setattr(procs, "_ps_field", lambda pid, field: asked.append((pid, field)) or "Fri Nov 27 19:49:22 2026")
    assert procs.process_start(4242) == "Fri Nov 27 19:49:22 2026"
    assert asked == [(4242, "lstart")]


def test_without_proc_the_watchdog_reads_a_zombie_from_ps(monkeypatch):
    monkeypatch.setattr(watchdog, "Path", NoProc)
    monkeypatch.setattr(watchdog.os, "kill", lambda pid, sig: None)  # alive as far as kill(0) can tell
    for stat, gone in (("Z\n", True), ("S+\n", False), ("", True)):
        monkeypatch.setattr(watchdog.subprocess, "run", lambda *a, stat=stat, **k: subprocess.CompletedProcess(a, 0, stat))
        assert watchdog.process_gone(4242) is gone, stat


def test_macos_open_max_caps_the_open_file_limit(monkeypatch):
    """macOS starts a process at 256 files and refuses more than OPEN_MAX (10240) even under an infinite hard limit."""
    monkeypatch.setattr(resource, "getrlimit", lambda which: (256, resource.RLIM_INFINITY))
    set_to = []

    def setrlimit(which, limits):
        if limits[0] > 10240:
            raise ValueError("current limit exceeds maximum limit")
        set_to.append(limits[0])
    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    assert connection.raise_open_file_limit() == 10240 and set_to == [10240]
