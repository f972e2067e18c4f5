"""What every rank agrees on about a link probe: which rank pairs it measures, in which order, how long the
round trips may run, and the gather row the figures travel in. No MLX here; the measuring is
engine/lockstep/link_probe.py, rank 0's schedule and view of the links engine/rank0/links.py.

The ring backend sends only between ring neighbours, so there the pairs are the ring's neighbours;
JACCL connects every pair (a full mesh), so there every pair is probed.
"""

from __future__ import annotations

LATENCY_ROUNDS = 5  # one-byte round trips per pair at most; the median counts
LATENCY_BUDGET = 0.01  # seconds: no further round trip starts after this (a busy host's trips are slow)
ROW_PER_PAIR = 3  # latency in ns, bandwidth in KiB/s, the probe's cost in µs (int32 each)
_INT32 = 2**31 - 1


def link_pairs(size: int, backend: str) -> list[tuple[int, int]]:
    """The rank pairs a probe measures, (a, b) with a < b, in the order every rank runs them."""
    if size < 2:
        return []
    if backend == "ring":
        return sorted({(min(r, (r + 1) % size), max(r, (r + 1) % size)) for r in range(size)})
    return [(a, b) for a in range(size) for b in range(a + 1, size)]


def encode(latency: float, bandwidth: float, cost: float) -> list[int]:
    """One pair's figures as the measuring rank contributes them to the gather."""
    return [min(_INT32, round(latency * 1e9)), min(_INT32, round(bandwidth / 1024)), min(_INT32, round(cost * 1e6))]


def link_row(pairs: list[tuple[int, int]], figures: dict[int, list[int]]) -> list[int]:
    """A rank's gather row: its figures for the pairs it measured (by pair index), zeros elsewhere."""
    row = [0] * (ROW_PER_PAIR * len(pairs))
    for index, values in figures.items():
        row[ROW_PER_PAIR * index: ROW_PER_PAIR * (index + 1)] = values
    return row
