"""What rank 0's socket server and the helper rank's listener (engine/helpers/rank_server.py) both do with a
request's connection: watch the peer for its leaving, and send a helper answer's frames. No MLX here."""

from __future__ import annotations

import anyio

from engine.rank0.errors import invalid_request
from ipc import ConnectionClosed, FrameError, FramedStream, FrameTooLarge, Msg

EXTRA_FRAME = ("this connection already carries a request: send each request on a connection of its own "
               "(closing a connection cancels its request)")


async def send_answer(conn: FramedStream, frames: list[Msg], rid: str) -> None:
    """A helper answer's frames (engine/rank0/helper_desk.py); one too large for the socket becomes the error saying
    so."""
    try:
        for frame in frames:
            await conn.send(frame)
    except FrameTooLarge:
        await send_quietly(conn, invalid_request(
            f"the answer is larger than the engine's socket allows (MAX_FRAME_BYTES={conn.max_frame}); send fewer or "
            "shorter documents", request_id=rid))
    except ConnectionClosed:
        pass


async def watch_peer(conn: FramedStream, rid: str, scope: anyio.CancelScope, complaint: list[Msg]) -> None:
    """The peer closing its connection (even half: shutdown for writing) ends the request. It sends nothing
    else: a frame (or broken framing) ends the request too, and complaint says why."""
    try:
        await conn.recv()
        complaint.append(invalid_request(EXTRA_FRAME, code="bad_frame", request_id=rid))
    except ConnectionClosed:
        pass
    except FrameError as exc:
        complaint.append(invalid_request(f"{exc}; {EXTRA_FRAME}", code="bad_frame", request_id=rid))
    scope.cancel()


async def send_quietly(conn: FramedStream, msg: Msg) -> None:
    """msg, unless the peer has gone."""
    try:
        await conn.send(msg)
    except ConnectionClosed:
        pass
