"""Is an engine serving on this socket? The one question start, stop, status and the supervisor ask."""

from __future__ import annotations

import socket
from pathlib import Path

import anyio

from ipc.connection import EngineUnavailable
from ipc.framing import ConnectionClosed, FrameError
from ipc.messages import Info
from ipc.probe import fetch_info


def engine_info(socket_path: Path, timeout: float = 2.0) -> Info | None:
    """Rank 0's Info, or None when nothing answers on socket_path within timeout."""
    if not Path(socket_path).is_socket():
        return None
    try:
        return anyio.run(fetch_info, str(socket_path), timeout)
    except (EngineUnavailable, ConnectionClosed, FrameError, TimeoutError, OSError):
        return None


def drop_stale_socket(socket_path: Path) -> bool:
    """Unlink a socket nothing listens on any more (a killed rank 0 cannot); False, and nothing removed, when
    the path is not a socket (never another program's file) or something still accepts on it."""
    path = Path(socket_path)
    if not path.is_socket():
        return not path.exists()
    if listening(path):
        return False
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def listening(path: Path, timeout: float = 2.0) -> bool:
    """Whether something accepts connections on the Unix socket at path (an engine or any other program)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(str(path))
        return True
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True  # e.g. a full backlog: someone is there
    finally:
        s.close()
