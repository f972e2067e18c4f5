"""Measure the links between ranks with send/recv: what every rank runs after a plan that asks for a probe.

Pairs go one after another in one order on every rank (engine/rank0/links.py: link_pairs); a rank runs
only its own pairs. The lower rank of a pair measures: LATENCY_ROUNDS one-byte round trips (after one to
warm up), then one send of `nbytes` answered by one byte. The figures go to rank 0 in one gather.
Everything travels on the model's stream, like the plans, so nothing interleaves with the model's own
collectives in a different order on some rank.
"""

from __future__ import annotations

import statistics
import time

import mlx.core as mx

from engine.rank0.links import LATENCY_ROUNDS, LinkProbes, encode


def _round_trip(one: mx.array, peer: int, group, stream, first: bool) -> None:
    """One byte there and back: `first` sends first (the measuring rank), the other answers."""
    if first:
        mx.eval(mx.distributed.send(one, peer, group=group, stream=stream))
        mx.eval(mx.distributed.recv_like(one, peer, group=group, stream=stream))
    else:
        mx.eval(mx.distributed.recv_like(one, peer, group=group, stream=stream))
        mx.eval(mx.distributed.send(one, peer, group=group, stream=stream))


def _measure(a_side: bool, peer: int, nbytes: int, group, stream) -> list[int] | None:
    """One pair: the measuring side returns its figures, the other None."""
    one = mx.zeros((1,), dtype=mx.uint8)
    big = mx.zeros((nbytes,), dtype=mx.uint8)
    mx.eval(one, big)
    t0 = time.perf_counter()
    _round_trip(one, peer, group, stream, a_side)  # warm-up: connections and buffers
    trips = []
    for _ in range(LATENCY_ROUNDS):
        t = time.perf_counter()
        _round_trip(one, peer, group, stream, a_side)
        trips.append(time.perf_counter() - t)
    t = time.perf_counter()
    if a_side:
        mx.eval(mx.distributed.send(big, peer, group=group, stream=stream))
        mx.eval(mx.distributed.recv_like(one, peer, group=group, stream=stream))
    else:
        mx.eval(mx.distributed.recv_like(big, peer, group=group, stream=stream))
        mx.eval(mx.distributed.send(one, peer, group=group, stream=stream))
    if not a_side:
        return None
    end = time.perf_counter()
    rtt = statistics.median(trips)
    # the big send's time is its bytes plus the answer's trip back; take one round trip out
    return encode(rtt / 2, nbytes / max(end - t - rtt, 1e-9), end - t0)


def probe(links: LinkProbes, nbytes: int, rank: int, group, stream) -> list[int]:
    """Run this rank's pairs; its gather row (engine/rank0/links.py: LinkProbes.row)."""
    figures = {}
    for index, (a, b) in enumerate(links.pairs):
        if rank in (a, b):
            got = _measure(rank == a, b if rank == a else a, nbytes, group, stream)
            if got is not None:
                figures[index] = got
    return links.row(rank, figures)
