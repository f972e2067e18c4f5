"""The doorbell: how rank 0 wakes the other ranks after an idle spell, so that idle ranks cost nothing.

A rank waiting inside all_sum busy-waits a whole core, so no rank may wait for work inside a
collective. When rank 0 has nothing to run, it sends one idle plan; every other rank then sleeps
in a blocking read on its own TCP connection from rank 0 (no CPU at all) until rank 0 rings it:
one byte to each, sent right before the next plan. A rank reads one byte per ring, so rings
never pile up or get lost between idle spells. While they sleep, rank 0 also collects the ranks'
once-a-second reports over these connections (`gather`) instead of in a collective: a rank that
froze keeps rank 0 waiting, exactly as a stalled collective would, and one that died is noticed
at once. Unlike a collective, the doorbell knows which ranks have not answered yet (`unanswered`),
so /health and status can name a frozen rank.

The connections are made once, at startup: rank 0 listens on the port it is given (the engine's is
RING_PORT-1, Settings.doorbell_port, so a firewall rule can allow it) and passes the port and a random
token to every rank through the plan channel's gather (`open_doorbell`); each other rank
connects to rank 0's address (from what mlx.launch put in its environment) and presents the token
and its rank. The listener closes when every rank is connected. Closed or broken connections
raise DoorbellError, which ends the rank like a lost collective peer. No MLX here.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import socket
import struct
import time
from collections.abc import Callable, Mapping

_HELLO = struct.Struct(">QI")  # the token, then the connecting rank
RING = b"\x01"  # join the next plan
REPORT = b"\x02"  # answer with your report row, then sleep on
_COUNT = struct.Struct(">I")
MAX_ROW = 64  # numbers in one report row
CONNECT_SECONDS = 60.0  # how long ranks get to find each other at startup

# Every rank contributes a row of int32s; every rank gets all rows (engine/lockstep/channel.py gather).
Gather = Callable[[list[int]], list[list[int]]]


class DoorbellError(RuntimeError):
    """A rank's doorbell connection is gone or could not be made: that rank is lost."""


def rank0_host(environ: Mapping[str, str] = os.environ) -> str:
    """Where the other ranks reach rank 0: the address mlx.launch gave rank 0 (the ring backend's host file,
    or JACCL's coordinator), or loopback when the ranks run on one machine without either."""
    coordinator = environ.get("MLX_JACCL_COORDINATOR", "")
    if coordinator:
        return coordinator.rsplit(":", 1)[0].strip("[]")
    path = environ.get("MLX_HOSTFILE", "")
    if path:
        try:
            with open(path) as f:
                hosts = json.load(f)
            first = hosts[0][0] if isinstance(hosts[0], list) else hosts[0]
            return str(first).rsplit(":", 1)[0].strip("[]")
        except (OSError, ValueError, IndexError, KeyError, TypeError):
            pass
    return "127.0.0.1"


def _tune(sock: socket.socket) -> None:
    """No Nagle delay for one-byte bells; keepalives so a vanished host is noticed while idle."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPALIVE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
            except OSError:
                pass


class Doorbell:
    """Rank 0's side: one connection per other rank."""

    def __init__(self, peers: dict[int, socket.socket]):
        self.peers = peers
        self.rings = 0
        # when the report requests went out, and the ranks that have not answered since (read by other threads:
        # replaced whole, never changed in place)
        self._asked: tuple[float, frozenset[int]] = (0.0, frozenset())

    def ring(self) -> None:
        """Wake every other rank (each reads exactly this one byte before joining the next plan)."""
        self._send_all(RING)
        self.rings += 1

    def gather(self, row: list[int]) -> list[list[int]]:
        """Every rank's report row (rank 0's is `row`), asked of the sleeping ranks; blocks until all answered,
        reading each answer as it comes so that the ones still missing are known (`unanswered`)."""
        self._send_all(REPORT)
        rows = {0: list(row)}
        left = {sock: rank for rank, sock in self.peers.items()}
        asked = time.monotonic()
        self._asked = (asked, frozenset(left.values()))
        try:
            while left:
                ready, _, _ = select.select(list(left), [], [])
                for sock in ready:
                    rank = left.pop(sock)
                    rows[rank] = self._answer(sock, rank)
                self._asked = (asked, frozenset(left.values()))
        finally:
            self._asked = (0.0, frozenset())
        return [rows[rank] for rank in sorted(rows)]

    @staticmethod
    def _answer(sock: socket.socket, rank: int) -> list[int]:
        try:
            (n,) = _COUNT.unpack(_read_exactly(sock, _COUNT.size))
            if n > MAX_ROW:
                raise struct.error(f"a row of {n} numbers")
            return list(struct.unpack(f">{n}q", _read_exactly(sock, 8 * n)))
        except (OSError, struct.error) as exc:
            raise DoorbellError(f"rank {rank} did not answer its report ({exc}); a peer rank is lost") from None

    def unanswered(self, now: float | None = None) -> dict[int, float]:
        """The ranks rank 0 is waiting for in a report request, with how long it has waited (any thread)."""
        asked, ranks = self._asked
        waited = (time.monotonic() if now is None else now) - asked
        return {rank: waited for rank in ranks}

    def _send_all(self, what: bytes) -> None:
        for rank, sock in self.peers.items():
            try:
                sock.sendall(what)
            except OSError as exc:
                raise DoorbellError(f"rank {rank}'s doorbell connection is gone ({exc}); a peer rank is lost") from None

    def close(self) -> None:
        for sock in self.peers.values():
            sock.close()


class Bell:
    """Another rank's side: sleep until rank 0 rings."""

    def __init__(self, sock: socket.socket, rank: int):
        self.sock = sock
        self.rank = rank

    def wait(self, timeout: float, wake: int | None = None) -> bytes | None:
        """RING or REPORT once rank 0 sends one; None after timeout seconds without, or as soon as the file
        descriptor wake is readable (this rank's own work arrived: engine/helpers/inbox.py). Raises DoorbellError
        when rank 0 closed the connection or it broke."""
        if wake is not None:
            ready, _, _ = select.select([self.sock, wake], [], [], timeout)
            if self.sock not in ready:
                return None
            timeout = 0.0  # readable: recv returns at once
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1)
        except TimeoutError:
            return None
        except OSError as exc:
            raise DoorbellError(f"rank {self.rank}: the doorbell connection to rank 0 broke ({exc}); "
                                "rank 0 is lost") from None
        if not data:
            raise DoorbellError(f"rank {self.rank}: rank 0 closed the doorbell connection; rank 0 is lost")
        if data not in (RING, REPORT):
            raise DoorbellError(f"rank {self.rank}: rank 0 sent {data!r} on the doorbell; the ranks are out of step")
        return data

    def answer(self, row: list[int]) -> None:
        """This rank's report row, asked for by REPORT."""
        self.sock.settimeout(None)
        try:
            self.sock.sendall(_COUNT.pack(len(row)) + struct.pack(f">{len(row)}q", *row))
        except OSError as exc:
            raise DoorbellError(f"rank {self.rank}: the doorbell connection to rank 0 broke ({exc}); "
                                "rank 0 is lost") from None

    def close(self) -> None:
        self.sock.close()


def open_doorbell(rank: int, size: int, gather: Gather, host: str | None = None,
                  timeout: float = CONNECT_SECONDS, port: int = 0) -> Doorbell | Bell:
    """Every rank calls this at startup (one gather): rank 0 gets its Doorbell, listening on port (0: any free
    one), the others their Bell. A port rank 0 cannot listen on ends every rank with DoorbellError."""
    listener = None
    row = [0, 0, 0]
    token = 0
    refused = ""
    if rank == 0:
        try:
            listener = socket.create_server(("", port), backlog=max(size, 8))
        except OSError as exc:  # the others still meet in the gather, and learn of it there (port 0)
            refused = f"{exc.strerror or exc}"
        else:
            token = secrets.randbits(62)
            row = [listener.getsockname()[1], token >> 31, token & 0x7FFFFFFF]
    try:
        port_used, high, low = gather(row)[0]
        if not port_used:
            if rank == 0:
                raise DoorbellError(f"rank 0 cannot listen for the doorbell on port {port} ({refused}): free that "
                                    "port (the engine's is RING_PORT-1) or set RING_PORT to another range")
            raise DoorbellError(f"rank {rank}: rank 0 could not open its doorbell on port {port} (see rank 0's log)")
        port = port_used
        if rank != 0:
            return Bell(_connect(host or rank0_host(), port, (high << 31) | low, rank, timeout), rank)
        return Doorbell(_accept(listener, token, size, timeout))
    finally:
        if listener is not None:
            listener.close()


def _connect(host: str, port: int, token: int, rank: int, timeout: float) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
            break
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise DoorbellError(f"rank {rank}: cannot reach rank 0's doorbell at {host}:{port} ({exc}); "
                                    "the ranks must reach each other over TCP: allow that port (RING_PORT-1) "
                                    "in rank 0's firewall") from None
            time.sleep(0.1)
    _tune(sock)
    sock.sendall(_HELLO.pack(token, rank))
    return sock


def _accept(listener: socket.socket, token: int, size: int, timeout: float) -> dict[int, socket.socket]:
    """Rank 0: one connection from each other rank, identified by the token; anything else is dropped."""
    peers: dict[int, socket.socket] = {}
    deadline = time.monotonic() + timeout
    while len(peers) < size - 1:
        left = deadline - time.monotonic()
        if left <= 0:
            missing = sorted(set(range(1, size)) - peers.keys())
            for sock in peers.values():
                sock.close()
            raise DoorbellError(f"rank 0: ranks {missing} did not connect to the doorbell within {timeout:g} s")
        listener.settimeout(left)
        try:
            sock, _ = listener.accept()
        except TimeoutError:
            continue
        sock.settimeout(min(left, 5.0))
        try:
            hello = _read_exactly(sock, _HELLO.size)
        except OSError:
            hello = b""
        got, peer = _HELLO.unpack(hello) if len(hello) == _HELLO.size else (None, 0)
        if got != token or not 0 < peer < size or peer in peers:
            sock.close()  # not one of ours (or a duplicate): ignore it
            continue
        sock.settimeout(None)
        _tune(sock)
        peers[peer] = sock
    return peers


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    """n bytes, or fewer when the peer closed first."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data
