"""Rank 0's ports held open while `./launch.sh check` probes the hosts, so each host's venv Python dials them as
its ranks will (JACCL's coordinator on RING_PORT, the doorbell on RING_PORT-1, at the hostfile's hosts[0].ips[0]).

A connection that opens proves the route, Local Network privacy on the dialling Mac and the firewall on this
one. Nothing accepts: the kernel completes the handshake into the backlog, which is all a dial needs to see.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

BACKLOG = 64  # every host dials each port once


@contextmanager
def listening(ips: list[str] | None, ports: tuple[int, ...]) -> Iterator[tuple[tuple[str, ...], list[str]]]:
    """Yields (the HOST:PORT addresses the probes should dial, hostfile faults); ips None: nothing to check."""
    if ips is None:
        yield (), []
        return
    if not ips:
        yield (), ["hosts[0] of HOSTFILE lists no ips, where the other ranks reach rank 0: add this Mac's LAN "
                   "address (ipconfig getifaddr en0) as its ips"]
        return
    ip = ips[0]
    addresses = []
    with ExitStack() as stack:
        for port in ports:
            sock = stack.enter_context(socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET))
            try:  # no SO_REUSEADDR: on macOS it would let this bind beside an engine listening on every address
                sock.bind((ip, port))
            except OSError as exc:
                if exc.errno == errno.EADDRNOTAVAIL:
                    yield (), [f"hosts[0].ips[0] {ip} of HOSTFILE is no address of this machine: run ./launch.sh "
                               "on the hostfile's first host (rank 0), or put that host's LAN address first"]
                    return
                continue  # in use: a running engine holds it, and a stray dial must not reach it
            sock.listen(BACKLOG)
            addresses.append(f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}")
        yield tuple(addresses), []
