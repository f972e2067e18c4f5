"""Helper work on a rank other than 0 (HELPER_RANK): jobs come from this rank's helper listener thread
(engine/helpers/rank_server.py) and run on its step thread, in the bounded slices rank 0 uses (engine/helpers/work.py).

A sleeping rank waits on rank 0's doorbell; a job arriving meanwhile writes one byte to a socket pair the doorbell
wait also watches (`fileno`), so an idle rank starts on it at once without polling. No MLX here.
"""

from __future__ import annotations

import queue
import socket

from engine.helpers.work import HelperWork, Job


class HelperInbox:
    """The step thread's side: `put` from any thread, `pending` and `run_slice` on the step thread."""

    def __init__(self, work: HelperWork):
        self.work = work
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    def put(self, job: Job) -> None:
        """Any thread: queue a job and wake the step thread if it sleeps."""
        self._queue.put(job)
        try:
            self._wake_w.send(b"\x01")
        except BlockingIOError:  # the pair is full of wake-ups already: the step thread will look anyway
            pass

    def fileno(self) -> int:
        """Readable while jobs may be waiting (a doorbell wait selects on it)."""
        return self._wake_r.fileno()

    def pending(self) -> bool:
        """Step thread: move the queued jobs into the work; whether any is left to compute."""
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                self.work.add(self._queue.get_nowait())
            except queue.Empty:
                break
        return self.work.pending()

    def run_slice(self) -> int:
        return self.work.run_slice()

    def close(self) -> None:
        self._wake_r.close()
        self._wake_w.close()
