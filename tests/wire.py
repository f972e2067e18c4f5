"""A blocking client of the engine socket for tests: handshake, one message, the frames that answer it."""

from __future__ import annotations

import socket
from pathlib import Path

import msgspec

from ipc import PROTOCOL_VERSION, Error, Finish, Hello, Info, InfoRequest, Msg, Welcome
from ipc.framing import HEADER, decode_message, encode_frame


class Session:
    """One connection to the engine; closing it cancels whatever it asked for."""

    def __init__(self, path: Path | str, timeout: float = 30.0, rcvbuf: int | None = None):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self._buf = b""
        self.sock.sendall(encode_frame(Hello(version=PROTOCOL_VERSION, client="test")))
        welcome = self.recv()
        assert isinstance(welcome, Welcome), welcome

    def send(self, msg: Msg) -> None:
        self.sock.sendall(encode_frame(msg))

    def recv(self) -> Msg | None:
        """The next frame, or None when the engine closed the connection."""
        while True:
            if len(self._buf) >= HEADER.size:
                (length,) = HEADER.unpack_from(self._buf)
                if len(self._buf) >= HEADER.size + length:
                    body = self._buf[HEADER.size : HEADER.size + length]
                    self._buf = self._buf[HEADER.size + length :]
                    return decode_message(body)
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self._buf += chunk

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def info(path: Path | str) -> Info:
    with Session(path, timeout=10) as s:
        s.send(InfoRequest())
        reply = s.recv()
    assert isinstance(reply, Info), reply
    return reply


def run(path: Path | str, msg: Msg, *, choices: int = 1, max_frames: int = 10_000, timeout: float = 30.0) -> list[Msg]:
    """Send msg on a new connection; the frames up to its Error, its `choices` Finishes, the engine
    closing, or max_frames (then the connection is closed, which cancels the request)."""
    frames: list[Msg] = []
    with Session(path, timeout) as s:
        s.send(msg)
        finished = 0
        while len(frames) < max_frames:
            frame = s.recv()
            if frame is None:
                break
            frames.append(frame)
            finished += isinstance(frame, Finish)
            if isinstance(frame, Error) or finished >= choices:
                break
    return frames


def frames(data: bytes) -> list[Msg]:
    """The messages in a byte string of whole frames."""
    out = []
    while data:
        (length,) = HEADER.unpack(data[:HEADER.size])
        out.append(decode_message(data[HEADER.size:HEADER.size + length]))
        data = data[HEADER.size + length:]
    return out


def deeply_nested_generate(depth: int) -> bytes:
    """The body of a Generate whose message nests `depth` arrays: msgpack itself sets no depth limit."""
    head = msgspec.msgpack.encode({"type": "generate", "request_id": "x", "kind": "chat", "params": {"max_tokens": 3}})
    return (b"\x85" + head[1:] + msgspec.msgpack.encode("messages") + b"\x91\x81"
            + msgspec.msgpack.encode("content") + b"\x91" * depth + b"\xc0")
