"""One generation's way out of rank 0: straight from the step thread to its socket while the client keeps up,
through the event loop (bounded) once it does not."""

from __future__ import annotations

import threading

import anyio

from ipc import Error, Finish
from ipc.framing import HEADER, encode_frame

DONE = object()  # after a generation's last event (an Error, or each choice's Finish): its relay may end


class Outbox:
    """Where the step loop's events for one generation go.

    While the client keeps up, the step thread writes a step's events for the generation straight to its
    non-blocking socket, in one write. A write that would block (a client reading slower than tokens come)
    hands the socket to the event loop: the unsent bytes and every later event wait in a bounded stream for
    the relay, and overflowing it cancels the generation. Once the relay has caught up (nothing waiting,
    nothing on its way to it), resume() gives the socket back to the step thread. A write that fails (the
    client left) or a frame over the limit leaves the rest to the relay for good. The lock makes every
    hand-over, and close() before the connection closes, atomic with a write."""

    __slots__ = ("stream", "max_frame", "sock", "raw", "pending", "left", "lock", "scope", "overflowed", "tail")

    def __init__(self, stream, max_frame: int) -> None:
        self.stream = stream
        self.max_frame = max_frame
        self.sock = None  # the raw socket while the step thread writes to it
        self.raw = None  # the raw socket while the step thread may write to it again
        self.pending = 0  # items handed to the event loop that the stream has not taken yet
        self.left = 1  # choices without their Finish yet
        self.lock = threading.Lock()
        self.scope: anyio.CancelScope | None = None
        self.overflowed = False
        self.tail = b""  # the rest of a frame the step thread's last write left half sent (the relay sends it)

    def open(self, sock, choices: int) -> None:
        """Event loop, once Started is written: the step thread writes from now on (when sock is a socket)."""
        self.left = choices
        with self.lock:
            self.sock = self.raw = sock

    def close(self) -> None:
        """Event loop: the step thread stops writing to the socket before the connection closes."""
        with self.lock:
            self.sock = self.raw = None

    def resume(self) -> None:
        """Event loop, after the relay wrote an item: with nothing left for it, the step thread writes again."""
        if self.raw is None or self.overflowed or self.stream.statistics().current_buffer_used:
            return
        with self.lock:
            if self.pending == 0 and self.raw is not None:
                self.sock = self.raw

    def deliver(self, msgs: list, queued: list, direct: bool = True) -> None:
        """Step thread: write msgs to the socket, or append (self, item) to queued for the event loop (all of
        them without direct: the socket is the event loop's until its relay has caught up)."""
        last = False
        for msg in msgs:
            if isinstance(msg, Finish):
                self.left -= 1
            if isinstance(msg, Error) or self.left <= 0:
                last = True
        with self.lock:
            if not direct:
                self.sock = None
            rest = self._write(msgs) if self.sock is not None else msgs
            if last:
                rest = [*rest, DONE]
            self.pending += len(rest)
        queued.extend((self, item) for item in rest)

    def _write(self, msgs: list) -> list:
        """With the lock held: write what it can, give up the socket if not everything; what is left."""
        frames = [encode_frame(msg) for msg in msgs]
        if any(len(frame) - HEADER.size > self.max_frame for frame in frames):
            self.sock = self.raw = None  # the relay's send raises FrameTooLarge for it, as for any frame
            return msgs
        data = frames[0] if len(frames) == 1 else b"".join(frames)
        try:
            sent = self.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self.sock = self.raw = None  # the client left: the relay's send says so
            return msgs
        if sent == len(data):
            return []
        self.sock = None
        rest = data[sent:]
        self.tail = rest if sent else b""
        return [rest]

    def put(self, item) -> None:
        """On the event loop: queue item, or end the generation when its client has stopped reading."""
        with self.lock:
            self.pending -= 1
        if self.overflowed:
            return
        try:
            self.stream.send_nowait(item)
        except anyio.WouldBlock:
            self.overflowed = True
            self.stream.close()
            if self.scope is not None:
                self.scope.cancel()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # the client left; the step loop hears of it through Withdraw
