"""`python -m ipc.probe`: ask engine rank 0 for its Info; exit 0 when it answers, 1 otherwise.

launch.sh judges engine readiness with this, never with mlx.launch's exit code.
"""

from __future__ import annotations

import argparse
import json
import sys

import anyio
import msgspec

from ipc.connection import EngineUnavailable, connect
from ipc.framing import ConnectionClosed, FrameError
from ipc.messages import Info, InfoRequest


async def fetch_info(socket_path: str, timeout: float) -> Info:
    """One InfoRequest round trip, bounded by timeout."""
    with anyio.fail_after(timeout):
        conn = await connect(socket_path, client="probe")
        try:
            await conn.send(InfoRequest())
            reply = await conn.recv()
        finally:
            await conn.aclose()
    if not isinstance(reply, Info):
        raise EngineUnavailable(f"engine answered info with {type(reply).__name__}")
    return reply


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, help="engine socket path")
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args()
    try:
        info = anyio.run(fetch_info, args.socket, args.timeout)
    except (EngineUnavailable, ConnectionClosed, FrameError, TimeoutError, OSError) as exc:
        print(f"engine not answering on {args.socket}: {exc or type(exc).__name__}", file=sys.stderr)
        return 1
    print(json.dumps(msgspec.to_builtins(info)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
