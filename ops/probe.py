"""Is an engine serving on this socket? The one question start, stop, status and the supervisor ask."""

from __future__ import annotations

import socket
import time
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


def listening(path: Path, timeout: float = 2.0, tries: int = 5, spacing: float = 0.2) -> bool:
    """Whether something accepts connections on the Unix socket at path (an engine or any other program).

    Only refusals every time over about a second mean no: macOS also refuses while a live listener's
    backlog is full (Linux answers EAGAIN then)."""
    for attempt in range(tries):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(str(path))
            return True
        except FileNotFoundError:
            return False
        except ConnectionRefusedError:
            if attempt + 1 < tries:
                time.sleep(spacing)
        except OSError:
            return True  # e.g. a full backlog on Linux: someone is there
        finally:
            s.close()
    return False
