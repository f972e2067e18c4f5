"""What every rank reports about itself, gathered on rank 0 about once a second.

Reports ride on the step protocol (a flag in the plan, then one small all_sum), so a
stalled or dead rank shows up as a stale report without any extra collective per token.
"""

from __future__ import annotations

import functools
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

import mlx.core as mx
import msgspec

from ipc.messages import RankState

REPORT_INTERVAL = 1.0
HOST_BYTES = 64
_KIB = 1024


def host_memory() -> tuple[int, int]:
    """(total, available) bytes of this host; available is 0 where the OS does not say."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        total = os.sysconf("SC_PHYS_PAGES") * page
    except (ValueError, OSError):
        return 0, 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return total, int(line.split()[1]) * _KIB
    except OSError:
        pass
    try:
        return total, os.sysconf("SC_AVPHYS_PAGES") * page
    except (ValueError, OSError):
        return total, 0


@functools.cache
def _device_info() -> Mapping[str, Any]:
    return mx.device_info()


def gpu_working_set(info: Mapping[str, Any] | None = None) -> int:
    """Bytes Metal lets this host's GPU wire (about 3/4 of RAM unless `iogpu.wired_limit_mb` is raised): a
    Mac pages or panics past it, whatever RAM is free; 0 where the device names no such limit (a CPU)."""
    info = _device_info() if info is None else info
    return int(info.get("max_recommended_working_set_size") or 0)


def model_memory(info: Mapping[str, Any] | None = None) -> int:
    """Bytes this rank can give the model: Metal's working set on a Mac, else what the OS says is available."""
    total, available = host_memory()
    return gpu_working_set(info) or available or total


def local_row(step: int, prompt_cache_bytes: int = 0, info: Mapping[str, Any] | None = None) -> list[int]:
    """This rank's state as int32s (memory in KiB so it fits)."""
    total, available = host_memory()
    return [os.getpid(), step & 0x7FFFFFFF, mx.get_active_memory() // _KIB, mx.get_cache_memory() // _KIB,
            mx.get_peak_memory() // _KIB, total // _KIB, available // _KIB, prompt_cache_bytes // _KIB,
            gpu_working_set(info) // _KIB]


def hostname_row() -> list[int]:
    name = socket.gethostname().encode()[:HOST_BYTES]
    return list(name.ljust(HOST_BYTES, b"\0"))


class RankReports:
    """Rank 0's latest view of every rank."""

    def __init__(self, hosts: list[str]):
        self.hosts = hosts
        self.states: list[RankState] = []
        self.at = 0.0
        self.helper_bytes: dict[int, int] = {}  # rank -> weights of the helper models pinned there

    def due(self, now: float) -> bool:
        return now - self.at >= REPORT_INTERVAL

    def update(self, rows: list[list[int]]) -> None:
        self.at = time.monotonic()
        self.states = [
            RankState(rank=r, host=self.hosts[r] if r < len(self.hosts) else "", pid=row[0], step=row[1],
                      active_memory=row[2] * _KIB, cache_memory=row[3] * _KIB, peak_memory=row[4] * _KIB,
                      host_memory_total=row[5] * _KIB, host_memory_available=row[6] * _KIB,
                      prompt_cache_bytes=row[7] * _KIB, gpu_working_set=row[8] * _KIB,
                      helper_bytes=self.helper_bytes.get(r, 0))
            for r, row in enumerate(rows)
        ]

    def snapshot(self, unanswered: dict[int, float] | None = None) -> list[RankState]:
        """The states with their age; unanswered: the ranks rank 0 still waits for (engine/lockstep/doorbell.py)."""
        age = time.monotonic() - self.at if self.at else 0.0
        late = unanswered or {}
        return [msgspec.structs.replace(s, report_age=age, unanswered=late.get(s.rank, 0.0)) for s in self.states]


def decode_hostnames(rows: list[list[int]]) -> list[str]:
    return [bytes(b for b in row if b).decode(errors="replace") for row in rows]
