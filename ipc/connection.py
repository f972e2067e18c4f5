"""Client and server helpers: Unix socket connections that open with a version handshake."""

from __future__ import annotations

import errno
import logging
import os
import resource
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import anyio.abc

from ipc.framing import DEFAULT_MAX_FRAME, ConnectionClosed, FrameError, FramedStream, TruncatedFrame
from ipc.messages import PROTOCOL_VERSION, Error, Hello, Welcome

HANDSHAKE_TIMEOUT = 5.0
# accept() errors that mean "not now" (out of file descriptors or kernel memory, a peer gone before it was
# accepted): the listener waits this long and accepts again, as asyncio's own servers do.
TRANSIENT_ACCEPT_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED})
ACCEPT_RETRY_SECONDS = 0.1
# The open-file limit a server process asks for (up to its hard limit): every stream holds a socket, and
# macOS starts processes with a soft limit of 256.
WANTED_OPEN_FILES = 65536

log = logging.getLogger(__name__)


class EngineUnavailable(Exception):
    """The engine socket is absent, refuses connections, or fails the handshake."""


def version_mismatch(theirs: int) -> Error:
    """The error both sides send when protocol versions differ."""
    return Error(
        status=503,
        code="protocol_version_mismatch",
        message=(
            f"protocol version mismatch: peer speaks v{theirs}, this side speaks "
            f"v{PROTOCOL_VERSION}; restart the API and the engine from the same checkout"
        ),
    )


async def connect(
    path: str | Path, *, client: str = "api", max_frame: int = DEFAULT_MAX_FRAME
) -> FramedStream:
    """Open a connection to the engine and complete the handshake."""
    try:
        stream = await anyio.connect_unix(str(path))
    except OSError as exc:
        raise EngineUnavailable(f"engine socket {path} is not accepting connections ({exc.strerror or exc})") from None
    conn = FramedStream(stream, max_frame)
    try:
        with anyio.fail_after(HANDSHAKE_TIMEOUT):
            await conn.send(Hello(version=PROTOCOL_VERSION, client=client))
            reply = await conn.recv()
    except TimeoutError:
        await conn.aclose()
        raise EngineUnavailable(f"engine handshake failed: the engine accepted the connection on {path} but sent no "
                                f"welcome within {HANDSHAKE_TIMEOUT:g} s (busy or frozen?)") from None
    except (ConnectionClosed, FrameError) as exc:
        await conn.aclose()
        raise EngineUnavailable(f"engine handshake failed: {str(exc) or type(exc).__name__}") from None
    except BaseException:
        # Cancelled mid-handshake (e.g. by a caller's deadline): never leak the socket.
        with anyio.CancelScope(shield=True):
            await conn.aclose()
        raise
    if isinstance(reply, Error):
        await conn.aclose()
        raise EngineUnavailable(reply.message)
    if not isinstance(reply, Welcome) or reply.version != PROTOCOL_VERSION:
        await conn.aclose()
        raise EngineUnavailable(f"engine answered the handshake with {type(reply).__name__}")
    return conn


async def accept_handshake(conn: FramedStream) -> bool:
    """Server side of the handshake; on failure an Error frame is sent and False returned."""
    try:
        with anyio.fail_after(HANDSHAKE_TIMEOUT):
            hello = await conn.recv()
    except TimeoutError:
        await _send_quietly(conn, Error(status=400, code="bad_frame",
                                        message=f"handshake failed: no complete hello within {HANDSHAKE_TIMEOUT:g} s"))
        return False
    except (FrameError, TruncatedFrame) as exc:
        await _send_quietly(conn, Error(status=400, code="bad_frame",
                                        message=f"handshake failed: {str(exc) or type(exc).__name__}"))
        return False
    except ConnectionClosed:
        return False
    if not isinstance(hello, Hello):
        await _send_quietly(conn, Error(status=400, code="bad_frame",
                                        message=f"expected hello as the first frame, got {type(hello).__name__.lower()}"))
        return False
    if hello.version != PROTOCOL_VERSION:
        await _send_quietly(conn, version_mismatch(hello.version))
        return False
    await conn.send(Welcome(version=PROTOCOL_VERSION, engine_pid=os.getpid()))
    return True


async def _send_quietly(conn: FramedStream, msg: Error) -> None:
    try:
        await conn.send(msg)
    except ConnectionClosed:
        pass


async def serve_unix(
    path: str | Path,
    handler: Callable[[FramedStream], Awaitable[None]],
    *,
    max_frame: int = DEFAULT_MAX_FRAME,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on a Unix socket (dir 0700, socket 0600) and run handler per handshaken connection.

    Use with ``await tg.start(serve_unix, ...)`` so bind errors surface to the caller.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    old_umask = os.umask(0o177)
    try:
        listener = await anyio.create_unix_listener(path)
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)

    async def _one(stream: anyio.abc.SocketStream) -> None:
        conn = FramedStream(stream, max_frame)
        async with stream:
            try:
                if await accept_handshake(conn):
                    await handler(conn)
            except ConnectionClosed:
                pass
            except Exception:
                # One connection's failure must never take the listener (and every other client) down.
                log.exception("connection handler failed")

    async with listener, anyio.create_task_group() as tg:
        task_status.started()
        refusing = 0  # accept() failures in a row
        while True:
            try:
                stream = await listener.accept()
            except anyio.BrokenResourceError as exc:
                cause = exc.__cause__
                if not isinstance(cause, OSError) or cause.errno not in TRANSIENT_ACCEPT_ERRORS:
                    raise
                if not refusing:
                    log.warning("cannot accept connections on %s (%s): retrying every %g s; raise the open-file "
                                "limit (ulimit -n) if this repeats", path, cause.strerror or cause,
                                ACCEPT_RETRY_SECONDS)
                refusing += 1
                await anyio.sleep(ACCEPT_RETRY_SECONDS)
                continue
            if refusing:
                log.warning("accepting connections on %s again after %d failed attempts", path, refusing)
                refusing = 0
            tg.start_soon(_one, stream)


def raise_open_file_limit(wanted: int = WANTED_OPEN_FILES) -> int:
    """Lift this process's soft open-file limit towards wanted (never above the hard limit, never down);
    returns the limit in force. A process serving many streams must not run out of sockets at 256."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        # macOS refuses more than its per-process maximum (OPEN_MAX, 10240) whatever the hard limit says
        for limit in (target, min(target, 10240)):
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
                return limit
            except (ValueError, OSError):
                continue
    return soft
