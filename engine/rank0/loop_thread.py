"""An anyio event loop in a daemon thread of its own, started and stopped by the step thread: rank 0's socket
server (engine/rank0/server.py) and the helper rank's listener (engine/helpers/rank_server.py). No MLX here."""

from __future__ import annotations

import asyncio
import logging
import threading

import anyio

from ipc import ignore_settled_wakeups

log = logging.getLogger(__name__)


class LoopThread:
    """start() runs serve() on the thread's loop and returns once serve() set `_ready` (or raises what kept it
    from it); stop() sets `_stop`, which serve() waits for, and joins the thread."""

    def __init__(self, name: str):
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: anyio.Event | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise self._failure

    def stop(self, wait: float = 5.0) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=wait)

    async def serve(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        try:
            anyio.run(self._main)
        except BaseException as exc:  # surfaced to start() or logged: the thread must not die silently
            if not self._ready.is_set():
                self._failure = exc
                self._ready.set()
            else:
                log.exception("%s failed", self._thread.name)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        ignore_settled_wakeups(self._loop)
        self._stop = anyio.Event()
        await self.serve()
