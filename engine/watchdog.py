"""Ends this rank when the step loop stops making progress, so no rank waits forever.

A rank stuck in a collective (its peer died or froze) cannot notice by itself: the
collective busy-waits in C++. This thread watches the loop's heartbeat from outside.
"""

from __future__ import annotations

import logging
import os
import threading
import time

log = logging.getLogger(__name__)

EXIT_STALLED = 70
LAST_WORDS_SECONDS = 2.0  # what logging the CRITICAL line may take before the exit happens anyway


class Watchdog:
    def __init__(self, timeout: float, rank: int):
        self.timeout = timeout
        self.rank = rank
        self.phase = "starting"
        self.last = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def beat(self, phase: str) -> None:
        """Record progress; `phase` names what the loop is about to do (shown if it stalls)."""
        self.last = time.monotonic()
        self.phase = phase

    def age(self) -> float:
        return time.monotonic() - self.last

    def _run(self) -> None:
        while True:
            time.sleep(min(1.0, self.timeout / 4))
            age = self.age()
            if age > self.timeout:
                # Exit even if logging blocks (a handler lock held by the stuck thread, a full pipe).
                deadline = threading.Timer(LAST_WORDS_SECONDS, os._exit, args=(EXIT_STALLED,))
                deadline.daemon = True
                deadline.start()
                log.critical("rank %d: no progress for %.1f s while %s (WATCHDOG_TIMEOUT=%.0f s): a peer rank "
                             "is dead or frozen; ending this rank", self.rank, age, self.phase, self.timeout)
                logging.shutdown()
                os._exit(EXIT_STALLED)
