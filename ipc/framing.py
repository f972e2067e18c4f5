"""Length-prefixed msgpack frames: a 4-byte big-endian length, then one encoded Message."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct

import anyio
import anyio.lowlevel
import msgspec
from anyio.abc import ByteStream, SocketAttribute

from ipc.messages import Message, Msg

HEADER = struct.Struct(">I")
DEFAULT_MAX_FRAME = 8 * 1024 * 1024
RECV_BYTES = 64 * 1024  # the most one read takes from the socket (more when a frame needs more)

log = logging.getLogger(__name__)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


class FrameError(Exception):
    """A frame that cannot be accepted: the connection must be closed."""


class FrameTooLarge(FrameError):
    """A frame longer than the configured maximum."""


class ConnectionClosed(Exception):
    """The peer closed the connection (cleanly or mid-frame)."""


class TruncatedFrame(ConnectionClosed):
    """The peer stopped sending in the middle of a frame; it may still read an error frame."""


def encode_frame(msg: Msg) -> bytes:
    """Encode one message with its length prefix."""
    body = _encoder.encode(msg)
    return HEADER.pack(len(body)) + body


def decode_message(body: bytes) -> Msg:
    """Decode one frame body; raises FrameError when it is not a valid Message."""
    try:
        return _decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise FrameError(f"malformed message: {exc}") from None
    except RecursionError:
        raise FrameError("malformed message: nested too deeply") from None


def ignore_settled_wakeups(loop: asyncio.AbstractEventLoop) -> None:
    """Keep the loop from logging a harmless race in anyio's Unix socket streams as an ERROR with a traceback.

    anyio waits for a readable Unix socket with `loop.add_reader(sock, future.set_result, None)`. When the
    wait ends (cancelled: a request ends, a client leaves) in the same loop turn in which the socket became
    readable, the reader callback was already queued and then sets the result of a settled future. Nothing
    is lost (the bytes stay in the socket for the next read; the reader is removed right after), but the
    default handler logs "Exception in callback Future.set_result(None)". Every other error still goes to
    the handler the loop had (or its default one)."""
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        if _settled_wakeup(context):
            log.debug("a socket became readable as its wait ended; nothing was lost")
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


def _settled_wakeup(context: dict) -> bool:
    callback = getattr(context.get("handle"), "_callback", None)
    future = getattr(callback, "__self__", None)
    return (isinstance(context.get("exception"), asyncio.InvalidStateError)
            and getattr(callback, "__name__", None) == "set_result"
            and isinstance(future, asyncio.Future) and future.done())


class FramedStream:
    """Send and receive whole Messages over a byte stream; one writer task at a time.

    It reads what the socket holds, up to RECV_BYTES at once, and keeps what is past the frame it returns:
    frames that arrived together cost one read, and the ones after the first no wait at all."""

    def __init__(self, stream: ByteStream, max_frame: int = DEFAULT_MAX_FRAME):
        self.stream = stream
        self.max_frame = max_frame
        self._buffer = bytearray()
        self.last_frame_bytes = 0  # the size of the last frame recv() returned
        self.unsent: memoryview | bytes = b""  # the rest of a send that was cancelled after it began
        sock = stream.extra(SocketAttribute.raw_socket, None)
        # None: not a socket of our own to write to (anyio's TCP streams on asyncio wrap theirs in a transport)
        self._sock = sock if isinstance(sock, socket.socket) else None

    async def readable(self, timeout: float) -> bool:
        """Wait at most timeout seconds for bytes to receive; consumes none, so it is safe to cancel."""
        if self._buffer:
            return True
        if self._sock is None:
            return True  # not a socket: recv() does the waiting
        with anyio.move_on_after(timeout):
            await anyio.wait_readable(self._sock)
            return True
        return False

    def arrived(self) -> bool:
        """Whether the next frame has already (begun to) arrive, so recv() will not wait for the peer to send."""
        if self._buffer:
            return True
        if self._sock is None:
            return False
        # A peek, not select(): select() refuses descriptors from 1024 on, which a busy API reaches.
        try:
            self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError:
            return True  # recv() raises at once
        return True  # a byte, or EOF: recv() does not wait either way

    async def send(self, msg: Msg) -> None:
        """Send one message; raises ConnectionClosed when the peer is gone."""
        frame = encode_frame(msg)
        if len(frame) - HEADER.size > self.max_frame:
            raise FrameTooLarge(f"outgoing frame of {len(frame)} bytes exceeds {self.max_frame}")
        await self.send_bytes(frame)

    async def send_bytes(self, data: bytes) -> None:
        """Send bytes that are already framed (what is left of a write another thread began). While it waits
        for the socket, `unsent` holds what has not gone yet: cancelled then, the stream is mid-frame."""
        if self._sock is None:
            try:
                await self.stream.send(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                raise ConnectionClosed(str(exc)) from None
            return
        await anyio.lowlevel.checkpoint()
        view = memoryview(data)
        while view:
            try:
                sent = self._sock.send(view)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                self.unsent = b""
                raise ConnectionClosed(str(exc) or type(exc).__name__) from None
            view = view[sent:]
            if view:
                if len(view) < len(data):
                    self.unsent = view
                await anyio.wait_writable(self._sock)
        self.unsent = b""

    async def recv(self) -> Msg:
        """Receive one message; raises ConnectionClosed at EOF, FrameError on bad input."""
        while True:
            buf = self._buffer
            need = HEADER.size
            if len(buf) >= HEADER.size:
                (length,) = HEADER.unpack_from(buf)
                if length > self.max_frame:
                    raise FrameTooLarge(f"frame of {length} bytes exceeds the limit of {self.max_frame}")
                need += length
                if len(buf) >= need:
                    body = bytes(buf[HEADER.size:need])
                    del buf[:need]
                    self.last_frame_bytes = length
                    return decode_message(body)
            try:
                buf.extend(await self.stream.receive(max(RECV_BYTES, need - len(buf))))
            except anyio.EndOfStream:
                if not buf:
                    raise ConnectionClosed("EndOfStream") from None
                got = len(buf) if need == HEADER.size else len(buf) - HEADER.size
                raise TruncatedFrame(f"truncated frame: the connection ended after {got} of "
                                     f"{need if need == HEADER.size else need - HEADER.size} bytes") from None
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                raise ConnectionClosed(str(exc) or type(exc).__name__) from None

    async def aclose(self) -> None:
        """Close the underlying stream."""
        await self.stream.aclose()
