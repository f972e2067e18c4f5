"""Rank 0's answers to Embed and Rerank when the helpers live on another rank (HELPER_RANK=k, k > 0).

Each request is forwarded whole on a TCP connection of its own to rank k's listener (engine/helpers/rank_server.py),
which checks, tokenizes and computes it between its own steps, and the frames it answers are relayed as they are.
All of it runs on rank 0's socket thread, never the step thread: the big model's loop never waits for rank k.
Rank k unreachable, or its connection lost mid-request, is a 503 saying so; rank k too slow, the request's
REQUEST_TIMEOUT (504). The client leaving closes the connection, and rank k drops the request's work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from engine.helpers.link import Address, HelperLinkError
from engine.rank0 import errors
from engine.rank0.helper_desk import not_served
from ipc import (
    PROTOCOL_VERSION,
    ConnectionClosed,
    Embed,
    Embedded,
    Error,
    FrameError,
    FramedStream,
    HelperHello,
    HelperState,
    HelperWelcome,
    Msg,
    Rerank,
)
from ipc.connection import HANDSHAKE_TIMEOUT

# rank k answers within REQUEST_TIMEOUT itself (a 504 of its own); rank 0 waits this much longer for that answer
ANSWER_GRACE_SECONDS = 5.0


def unavailable(request_id: str, rank: int, why: str) -> Error:
    """503: the helper rank cannot be reached or its connection broke."""
    return Error(status=503, code="helper_rank_unavailable", request_id=request_id,
                 message=f"the helper models run on rank {rank} (HELPER_RANK), which {why}; retry in a moment, and "
                         "if it persists see `./launch.sh status` and that rank's log")


class RemoteHelpers:
    """HelperDesk's counterpart on rank 0 for helpers pinned on rank `rank`."""

    def __init__(self, address: Address, rank: int, timeout: float, max_frame: int,
                 states: list[HelperState] | None = None):
        self.address = address
        self.rank = rank
        self.timeout = timeout  # REQUEST_TIMEOUT
        self.max_frame = max_frame  # MAX_FRAME_BYTES: rank k cuts its answers to the same
        self.states = list(states or [])  # what rank k serves (welcome() at startup)
        self.grace = ANSWER_GRACE_SECONDS

    def welcome(self) -> list[HelperState]:
        """Startup, on the main thread: what rank k serves; HelperLinkError in a sentence when it cannot be asked."""
        async def ask() -> list[HelperState]:
            conn = await self._connect()
            await conn.aclose()
            return self.states

        try:
            return anyio.run(ask)
        except (OSError, TimeoutError, ConnectionClosed, FrameError, _Refused) as exc:
            raise HelperLinkError(f"rank 0 cannot reach rank {self.rank}'s helper listener at {self.address.host}:"
                                  f"{self.address.port} ({exc or type(exc).__name__}): allow TCP connections from "
                                  f"rank 0 to that host, or set HELPER_RANK=0") from None

    async def answer(self, conn: Any, msg: Embed | Rerank, lanes: Any, watch: Callable) -> list[Msg]:
        """The frames answering msg (none: the client left); watch(conn, rid, scope, complaint) ends it if the
        client goes, which closes rank k's connection and drops its work there."""
        rid = msg.request_id
        kind = "embedding" if isinstance(msg, Embed) else "rerank"
        if not any(s.kind == kind for s in self.states):
            return [not_served(kind, rid)]
        complaint: list[Msg] = []
        reply: list[Msg] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch, conn, rid, tg.cancel_scope, complaint)
            reply = await self._forward(msg)
            tg.cancel_scope.cancel()
        return complaint[:1] if complaint else reply

    async def _forward(self, msg: Embed | Rerank) -> list[Msg]:
        rid = msg.request_id
        try:
            peer = await self._connect()
        except (OSError, TimeoutError, ConnectionClosed, FrameError, _Refused) as exc:
            return [unavailable(rid, self.rank, f"cannot be reached ({exc or type(exc).__name__})")]
        frames: list[Msg] = []
        try:
            await peer.send(msg)
            with anyio.fail_after(self.timeout + self.grace):
                while True:
                    frame = await peer.recv()
                    frames.append(frame)
                    if not (isinstance(frame, Embedded) and frame.more):
                        return frames
        except TimeoutError:
            return [errors.timed_out(rid)]
        except (OSError, ConnectionClosed, FrameError) as exc:
            return [unavailable(rid, self.rank, f"lost this request ({exc or type(exc).__name__})")]
        finally:
            with anyio.CancelScope(shield=True):
                await peer.aclose()

    async def _connect(self) -> FramedStream:
        """A handshaken connection to rank k (its welcome refreshes the states); raises what went wrong."""
        with anyio.fail_after(HANDSHAKE_TIMEOUT):
            stream = await anyio.connect_tcp(self.address.host, self.address.port)
            conn = FramedStream(stream, self.max_frame)
            try:
                await conn.send(HelperHello(version=PROTOCOL_VERSION, token=self.address.token))
                reply = await conn.recv()
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await conn.aclose()
                raise
        if not isinstance(reply, HelperWelcome):
            await conn.aclose()
            raise _Refused(reply.message if isinstance(reply, Error) else f"it answered {type(reply).__name__}")
        self.states = list(reply.helpers)
        return conn


class _Refused(Exception):
    """Rank k answered the handshake with something other than its welcome (a version mismatch)."""
