"""Where rank 0 reaches the helper rank (HELPER_RANK=k, k > 0): one startup gather every rank joins alike.

Rank k listens on a free TCP port of the interface it reached rank 0's doorbell from (so rank 0 can reach it
back) and contributes the address, the port and a random token; the other ranks contribute zeros. Rank 0 then
opens one connection per helper request (engine/rank0/helper_remote.py), presenting the token. A rank k that could
not listen contributes zeros too, and every rank ends with the same sentence. No MLX here (the listener's
modules, which may import it, load on rank k alone).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from config import Settings
from engine.lockstep.doorbell import Bell, DoorbellError, Gather

HOST_BYTES = 64  # an IPv6 address in text fits


class HelperLinkError(DoorbellError):
    """The helper rank's listener cannot be opened or reached: the engine cannot start as configured."""


@dataclass(frozen=True)
class Address:
    """The helper rank's listener, and the token that opens it."""

    host: str
    port: int
    token: int  # 62 bits, sent as two int31s


def row(address: Address | None) -> list[int]:
    """This rank's contribution to the gather: the helper rank's address, zeros from every other rank."""
    if address is None:
        return [0] * (3 + HOST_BYTES)
    host = address.host.encode()[:HOST_BYTES]
    return [address.port, address.token >> 31, address.token & 0x7FFFFFFF, *host.ljust(HOST_BYTES, b"\0")]


def read(values: list[int]) -> Address | None:
    """The address in a row (None: zeros, the helper rank could not listen)."""
    port, high, low, *host = values
    if not port:
        return None
    return Address(bytes(b for b in host if b).decode(), port, (high << 31) | low)


def exchange(gather: Gather, helper_rank: int, mine: Address | None, why: str = "") -> Address:
    """Every rank: the helper rank's address (mine on that rank, None elsewhere); HelperLinkError when it has none."""
    rows = gather(row(mine))
    found = read(rows[helper_rank])
    if found is None:
        raise HelperLinkError(f"rank {helper_rank} (HELPER_RANK) could not listen for helper requests"
                              + (f" ({why})" if why else " (see its log)")
                              + "; free a TCP port on that host or set HELPER_RANK=0")
    return found


def open_link(settings: Settings, rank: int, helpers: dict[str, Any], gather: Gather, bell: Any,
              beat: Callable[[str], None]) -> tuple[Any, Any]:
    """Every rank, HELPER_RANK=k > 0: rank k opens its listener (engine/helpers/rank_server.py) and every rank learns
    where in one gather. Returns rank k's inbox (its step loop runs the work between its steps) and rank 0's
    forwarder (engine/rank0/helper_remote.py), None for what a rank has not; HelperLinkError on every rank when rank k
    cannot listen, on rank 0 when it cannot reach it."""
    k = settings.HELPER_RANK
    beat(f"opening rank {k}'s helper listener")
    mine, why, inbox = None, "", None
    if rank == k:
        from engine.helpers.inbox import HelperInbox
        from engine.helpers.rank_server import HelperRankServer
        from engine.helpers.work import HelperWork
        from engine.rank0.helper_desk import HelperDesk

        inbox = HelperInbox(HelperWork(settings.HELPER_TOKENS_PER_STEP, beat))
        desk = HelperDesk(helpers, inbox, settings.HELPER_MAX_INPUTS, settings.REQUEST_TIMEOUT)
        token = secrets.randbits(62)
        server = HelperRankServer(desk, [h.state(k) for h in helpers.values()], token, settings.MAX_FRAME_BYTES)
        assert isinstance(bell, Bell)
        host = bell.sock.getsockname()[0]  # the interface this rank reached rank 0 from: rank 0 reaches it there
        try:
            mine = Address(host, server.start(host), token)
        except OSError as exc:
            why = f"{host}: {exc.strerror or exc}"
    address = exchange(gather, k, mine, why)
    if rank != 0:
        return inbox, None
    from engine.rank0.helper_remote import RemoteHelpers

    beat(f"asking rank {k} for its helper models")
    remote = RemoteHelpers(address, k, settings.REQUEST_TIMEOUT, settings.MAX_FRAME_BYTES)
    remote.welcome()
    logging.getLogger(__name__).info("helper models on rank %d (%s:%d): %s", k, address.host, address.port,
                                     ", ".join(f"{s.kind} {s.name}" for s in remote.states))
    return None, remote
