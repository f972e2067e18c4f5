"""Bytes between the spreading ranks: small broadcasts and tables through all_sum, blobs in chunks.

A blob travels from rank 0 by an all_sum where rank 0 contributes the bytes and the others zeros, as
mlx_lm.share does (the path measured at several GB/s over Thunderbolt with JACCL), so every rank receives
it at once whatever the topology; or, asked for (`--via sendrecv`), by send/recv to each receiver, which
on bare loopback here moves about twice an all_sum's bytes per second (an all_sum moves every byte through
a reduce and a gather; bench/README.md has the table) but is the less trodden path on JACCL. Every
rank knows each chunk's length from the manifest, so no length travels. The next chunk's transfer is
queued before the current one is written (or read, on rank 0), so disk and link work at once. Nothing here
names a stream: the spread runs with the CPU as default device, where MLX runs collectives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import mlx.core as mx
import numpy as np

VIAS = ("sendrecv", "allsum")


def pick_via(via: str) -> str:
    """"auto": all_sum, whatever the number of ranks."""
    return "allsum" if via == "auto" else via


class Wire:
    def __init__(self, group: mx.distributed.Group):
        self.group = group
        self.rank = group.rank()
        self.size = group.size()

    def broadcast(self, data: bytes | None) -> bytes:
        """Rank 0's bytes, on every rank (the others pass None)."""
        n = int(self.gather([len(data) if self.rank == 0 else 0])[0][0])
        buf = np.zeros(n, dtype=np.uint8)
        if self.rank == 0:
            buf[:] = np.frombuffer(data, dtype=np.uint8)
        out = mx.distributed.all_sum(mx.array(buf), group=self.group)
        mx.eval(out)
        return np.asarray(out).tobytes()

    def gather(self, row: list[int]) -> list[list[int]]:
        """Every rank contributes one row of int64s; every rank gets all rows (an all_sum of disjoint rows)."""
        table = np.zeros((self.size, len(row)), dtype=np.int64)
        table[self.rank] = row
        out = mx.distributed.all_sum(mx.array(table), group=self.group)
        mx.eval(out)
        return np.asarray(out).tolist()


def chunks(start: int, size: int, chunk: int) -> Iterator[tuple[int, int]]:
    pos = start
    while pos < size:
        n = min(chunk, size - pos)
        yield pos, n
        pos += n


def send_blob(wire: Wire, via: str, start: int, size: int, chunk: int, read: Callable[[int, int], bytes],
              receivers: list[int], sent: Callable[[int], None]) -> None:
    """Rank 0: the blob's bytes [start, size) to the receivers; sent(n) after each chunk left."""
    pending: tuple[list[mx.array], int] | None = None
    for pos, n in chunks(start, size, chunk):
        data = mx.array(np.frombuffer(read(pos, n), dtype=np.uint8))
        if via == "sendrecv":
            outs = [mx.distributed.send(data, dst, group=wire.group) for dst in receivers]
        else:
            outs = [mx.distributed.all_sum(data, group=wire.group)]
        mx.async_eval(outs)
        if pending is not None:
            mx.eval(pending[0])
            sent(pending[1])
        pending = (outs, n)
    if pending is not None:
        mx.eval(pending[0])
        sent(pending[1])


def receive_blob(wire: Wire, via: str, start: int, size: int, chunk: int,
                 write: Callable[[int, memoryview], None] | None) -> None:
    """Any other rank: the blob's chunks from rank 0, each to write(pos, bytes); write None takes part in
    the all_sum without keeping anything (a rank that holds the blob already)."""
    pending: tuple[mx.array, int] | None = None
    for pos, n in chunks(start, size, chunk):
        if via == "sendrecv":
            out = mx.distributed.recv((n,), mx.uint8, 0, group=wire.group)
        else:
            out = mx.distributed.all_sum(mx.zeros((n,), dtype=mx.uint8), group=wire.group)
        mx.async_eval(out)
        if pending is not None:
            _land(pending, write)
        pending = (out, pos)
    if pending is not None:
        _land(pending, write)


def _land(pending: tuple[mx.array, int], write: Callable[[int, memoryview], None] | None) -> None:
    out, pos = pending
    mx.eval(out)
    if write is not None:
        write(pos, memoryview(np.asarray(out)).cast("B"))
