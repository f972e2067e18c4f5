"""Measure the links between ranks with send/recv: what every rank runs after a plan that asks for a probe.

Pairs go one after another in one order on every rank (engine/lockstep/link_pairs.py); a rank runs
only its own pairs. The lower rank of a pair measures: one-byte round trips (one to warm up, then up to
LATENCY_ROUNDS while they fit in LATENCY_BUDGET; half the median is the latency), then one send of `nbytes`
answered by one byte (the bandwidth). The measuring rank decides when the round trips end and says so in the
byte it sends (1: the last), so both sides agree on every message's size without a clock. The figures go to
rank 0 in one gather. Every rank meets in an all_sum after each pair: a small send, a large one, then a small one
again between two ranks, with the next pair's bytes close behind, is a pattern MLX's send/recv has been seen to
answer with wrong data or a hang, and a barrier between pairs is its known cure. Everything is built beside the
model's work (engine/lockstep/beside.py), like the plans, on the CPU stream the model's own collectives take, so
nothing interleaves with them in a different order on some rank, and nothing runs on a GPU stream.
"""

from __future__ import annotations

import statistics
import time

import mlx.core as mx

from engine.lockstep.beside import beside
from engine.lockstep.link_pairs import LATENCY_BUDGET, LATENCY_ROUNDS, encode, link_row

_MORE, _LAST = mx.array([0], dtype=mx.uint8), mx.array([1], dtype=mx.uint8)


def _pings(peer: int, group) -> list[float]:
    """The measuring side's round trips: the first warms up (connections, buffers) and is not counted."""
    trips: list[float] = []
    start = time.perf_counter()
    for i in range(LATENCY_ROUNDS + 1):
        last = i == LATENCY_ROUNDS or (i >= 1 and time.perf_counter() - start > LATENCY_BUDGET)
        t = time.perf_counter()
        mx.eval(mx.distributed.send(_LAST if last else _MORE, peer, group=group))
        mx.eval(mx.distributed.recv_like(_MORE, peer, group=group))
        if i:
            trips.append(time.perf_counter() - t)
        if last:
            break
    return trips


def _echo(peer: int, group) -> None:
    """The other side: answer every ping with its own byte, until the last one."""
    while True:
        got = mx.distributed.recv_like(_MORE, peer, group=group)
        mx.eval(mx.distributed.send(got, peer, group=group))
        if got.item():
            return


def _measure(a_side: bool, peer: int, nbytes: int, group) -> list[int] | None:
    """One pair: the measuring side returns its figures, the other None."""
    big = mx.zeros((nbytes,), dtype=mx.uint8)
    mx.eval(big, _MORE, _LAST)
    if not a_side:
        _echo(peer, group)
        mx.eval(mx.distributed.recv_like(big, peer, group=group))
        mx.eval(mx.distributed.send(_MORE, peer, group=group))
        return None
    t0 = time.perf_counter()
    trips = _pings(peer, group)
    t = time.perf_counter()
    mx.eval(mx.distributed.send(big, peer, group=group))
    mx.eval(mx.distributed.recv_like(_MORE, peer, group=group))
    end = time.perf_counter()
    # the big send's time is its bytes plus a round trip (the answer's): take the fastest round trip out, at most
    # half the time, so that a round trip slower than the others (a busy host) cannot inflate the figure
    took = end - t
    return encode(statistics.median(trips) / 2, nbytes / max(took - min(trips), took / 2, 1e-9), end - t0)


def probe(pairs: list[tuple[int, int]], nbytes: int, rank: int, group, stream) -> list[int]:
    """Run this rank's pairs (link_pairs' order) beside the model's `stream`; its gather row (link_row)."""
    figures = {}
    with beside(stream):
        for index, (a, b) in enumerate(pairs):
            if rank in (a, b):
                got = _measure(rank == a, b if rank == a else a, nbytes, group)
                if got is not None:
                    figures[index] = got
            mx.eval(mx.distributed.all_sum(mx.array([1], dtype=mx.int32), group=group))  # the barrier
    return link_row(pairs, figures)
