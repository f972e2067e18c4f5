"""The helper rank's listener (HELPER_RANK=k, k > 0): rank 0 forwards each Embed or Rerank here, on a TCP
connection of its own, and relays the answer to its client (engine/rank0/helper_remote.py).

The wire is the engine socket's (msgspec frames, ipc/): HelperHello with the startup token, HelperWelcome listing
the helpers, then one Embed or Rerank answered as rank 0 answers it (engine/rank0/helper_desk.py: checks, tokens,
the bounded slices this rank's step thread runs between its steps). Closing the connection drops the work still
queued. An anyio event loop in a thread of its own, as rank 0's socket server.
"""

from __future__ import annotations

import logging

import anyio
from anyio.abc import SocketAttribute, SocketStream

from engine.rank0.errors import generation_failed, invalid_request
from engine.rank0.helper_desk import HelperDesk
from engine.rank0.lanes import TokenizerLanes
from engine.rank0.loop_thread import LoopThread
from engine.rank0.peer import send_answer, watch_peer
from ipc import (
    PROTOCOL_VERSION,
    ConnectionClosed,
    Embed,
    FrameError,
    FramedStream,
    HelperHello,
    HelperState,
    HelperWelcome,
    Rerank,
)
from ipc.connection import HANDSHAKE_TIMEOUT, version_mismatch

log = logging.getLogger(__name__)


class HelperRankServer(LoopThread):
    """Serves the helpers of this rank to rank 0, from a background thread."""

    def __init__(self, desk: HelperDesk, states: list[HelperState], token: int, max_frame: int):
        super().__init__("helper-rank")
        self.desk = desk
        self.states = states
        self.token = token
        self.max_frame = max_frame  # MAX_FRAME_BYTES, as on rank 0's socket: its answers pass through unchanged
        self.host, self.port = "", 0
        self._lanes: TokenizerLanes | None = None

    def listen(self, host: str, port: int = 0) -> int:
        """Listen on host:port (0: a free port); the port listened on. Raises OSError when it cannot."""
        self.host, self.port = host, port
        self.start()
        return self.port

    async def serve(self) -> None:
        self._lanes = TokenizerLanes()
        listener = await anyio.create_tcp_listener(local_host=self.host, local_port=self.port)
        self.port = listener.extra(SocketAttribute.local_port)
        self._ready.set()
        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, self._one, tg)
            await self._stop.wait()
            tg.cancel_scope.cancel()

    async def _one(self, stream: SocketStream) -> None:
        conn = FramedStream(stream, self.max_frame)
        async with stream:
            try:
                with anyio.fail_after(HANDSHAKE_TIMEOUT):
                    hello = await conn.recv()
                    if not isinstance(hello, HelperHello) or hello.token != self.token:
                        return  # not rank 0: dropped without a word
                    if hello.version != PROTOCOL_VERSION:
                        await conn.send(version_mismatch(hello.version))
                        return
                    await conn.send(HelperWelcome(version=PROTOCOL_VERSION, helpers=self.states))
                    msg = await conn.recv()  # rank 0 sends its request at once (or closes: it only asked what we serve)
                if not isinstance(msg, Embed | Rerank):
                    await conn.send(invalid_request(f"unexpected {type(msg).__name__.lower()} message on the helper "
                                                    "rank's listener; send embed or rerank", code="bad_frame"))
                    return
                try:
                    frames = await self.desk.answer(conn, msg, self._lanes, watch_peer)
                except Exception:  # a bug, not the client's fault: answer it, keep serving
                    log.exception("%s %s failed", type(msg).__name__.lower(), msg.request_id)
                    frames = [generation_failed(msg.request_id, "the helper rank failed this request (see its log); "
                                                                "other requests are unaffected")]
                await send_answer(conn, frames, msg.request_id)
            except (ConnectionClosed, FrameError, TimeoutError):
                pass
