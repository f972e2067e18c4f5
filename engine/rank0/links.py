"""Link probes: which rank pairs get measured, when rank 0 decides a probe, and what it last measured.

A probe is a decision like any other: rank 0 puts its size in an idle plan (Plan.probe), and every rank
runs it right after applying that plan (engine/lockstep/link_probe.py). Rank 0 decides one only while
nothing runs or waits, at most every PROBE_EVERY seconds, so a probe never delays a request: one arriving
meanwhile waits for that one probe, which its byte cap and its size (from the last measurement) keep short.
Which pairs get measured, and the row their figures travel in, every rank agrees on
(engine/lockstep/link_pairs.py). No MLX here.
"""

from __future__ import annotations

import queue
import time

import msgspec

from engine.lockstep.link_pairs import ROW_PER_PAIR, link_pairs, link_row
from engine.lockstep.plan import Plan
from ipc.messages import LinkState

PROBE_EVERY = 60.0  # seconds between probes of an idle engine
FIRST_AFTER = 2.0  # seconds after start: the first idle moment after that probes
# The bandwidth probe aims at TARGET_SECONDS on the slowest pair last measured, within these bytes; the first
# one (nothing measured yet) sends FIRST_BYTES: 8 ms on a 1 Gb/s link, and several round trips' worth on a fast one,
# so that latency does not swamp it.
TARGET_SECONDS = 0.02
MIN_BYTES = 256 * 1024
FIRST_BYTES = 1024 * 1024
MAX_BYTES = 4 * 1024 * 1024


def busy(scheduler, inbound: queue.SimpleQueue) -> bool:
    """Rank 0: something runs or waits in the scheduler, or a request is on its way in (admitted by the socket
    thread, not yet taken from the inbound queue)."""
    return scheduler.has_work() or scheduler.counters.waiting > 0 or not inbound.empty()


class LinkProbes:
    """Rank 0's schedule of probes and its view of the links."""

    def __init__(self, size: int, backend: str, hosts: list[str], start: float | None = None):
        self.pairs = link_pairs(size, backend)
        self.hosts = hosts
        self.next_at = (time.monotonic() if start is None else start) + FIRST_AFTER
        self.links: list[LinkState] = []
        self._measured = 0.0  # monotonic time of the last probe

    def due(self, now: float, busy: bool) -> bool:
        """Whether a probe is due: only when the engine is idle (busy: something runs, waits, or is on its way
        in), and at most every PROBE_EVERY s."""
        return bool(self.pairs) and not busy and now >= self.next_at

    def decide(self, now: float, busy: bool) -> int:
        """The bandwidth probe's bytes for the plan rank 0 is making now, or 0 for no probe."""
        if not self.due(now, busy):
            return 0
        self.next_at = now + PROBE_EVERY
        return self.probe_bytes()

    def attach(self, plan: Plan, now: float, busy: bool) -> Plan:
        """The plan rank 0 is about to send, asking for a probe when it is idle (not shutting down) and one is due."""
        if not plan.idle or plan.shutdown:
            return plan
        nbytes = self.decide(now, busy)
        return msgspec.structs.replace(plan, probe=nbytes) if nbytes else plan

    def probe_bytes(self) -> int:
        """Sized from the slowest link last measured, so the probe stays short on a slow link."""
        measured = [link.bandwidth_bytes_per_second for link in self.links if link.bandwidth_bytes_per_second > 0]
        if not measured:
            return FIRST_BYTES
        return int(max(MIN_BYTES, min(MAX_BYTES, min(measured) * TARGET_SECONDS)))

    def record(self, rows: list[list[int]], nbytes: int, now: float | None = None) -> None:
        """Rank 0: every rank's row from the gather after a probe of nbytes."""
        self._measured = time.monotonic() if now is None else now
        wall = time.time()
        links = []
        for index, (a, b) in enumerate(self.pairs):
            lat_ns, bw_kib, cost_us = rows[a][ROW_PER_PAIR * index: ROW_PER_PAIR * (index + 1)]
            links.append(LinkState(a=a, b=b, host_a=self._host(a), host_b=self._host(b), latency_seconds=lat_ns / 1e9,
                                   bandwidth_bytes_per_second=bw_kib * 1024.0, probe_bytes=nbytes,
                                   probe_seconds=cost_us / 1e6, measured_at=wall))
        self.links = links

    def snapshot(self, now: float | None = None) -> list[LinkState]:
        """The links with their age (seconds since the probe)."""
        age = (time.monotonic() if now is None else now) - self._measured
        return [msgspec.structs.replace(link, age=age) for link in self.links]

    def _host(self, rank: int) -> str:
        return self.hosts[rank] if rank < len(self.hosts) else ""
