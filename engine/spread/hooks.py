"""Test hooks of the spreading programs, set in the environment with MCS_TEST_HOOKS=1 (each "RANK:NUMBER"; parsed
by ipc.spread.test_hook, ignored without the switch).

MCS_SPREAD_TEST_FREE_BYTES  that rank reports NUMBER free bytes instead of its disk's (the space check; the
                            rsync transport, ops/spread_rsync.py, reads it too)
MCS_SPREAD_TEST_PAUSE       rank 0 stops sending after NUMBER chunks and waits to be killed (a killed spread)
MCS_SPREAD_TEST_EXIT        that rank kills itself with SIGKILL after NUMBER chunks received (a rank that dies)
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from ipc.spread import test_hook as hook


class ChunkHooks:
    """Counts the chunks this rank moved and acts when a test asked it to."""

    def __init__(self, rank: int):
        self.rank = rank
        self.count = 0
        self.pause = hook("MCS_SPREAD_TEST_PAUSE", rank)
        self.exit = hook("MCS_SPREAD_TEST_EXIT", rank)

    def chunk(self) -> None:
        self.count += 1
        if self.count == self.pause:
            print(f"spread rank {self.rank}: test hook: paused after {self.count} chunk(s)", file=sys.stderr,
                  flush=True)
            threading.Event().wait()
        if self.count == self.exit:
            print(f"spread rank {self.rank}: test hook: killing myself after {self.count} chunk(s)",
                  file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
