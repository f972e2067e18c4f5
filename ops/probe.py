"""Is an engine serving on this socket? The one question start, stop, status and the supervisor ask."""

from __future__ import annotations

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
    """Unlink a socket no engine answers on (a killed rank 0 cannot); False when one still answers."""
    if engine_info(socket_path) is not None:
        return False
    try:
        Path(socket_path).unlink()
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True
