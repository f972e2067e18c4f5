"""HELPER_RANK=k > 0 at startup, on every rank alike: rank k's listener opened, its address exchanged
(engine/helpers/link.py), rank 0's forwarder made and told what rank k serves."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import Any

from config import Settings
from engine.helpers.link import Address, exchange
from engine.lockstep.doorbell import Bell, Gather


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
            mine = Address(host, server.listen(host, settings.HELPER_PORT), token)
        except OSError as exc:
            port = f":{settings.HELPER_PORT} (HELPER_PORT)" if settings.HELPER_PORT else ""
            why = f"{host}{port}: {exc.strerror or exc}"
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
