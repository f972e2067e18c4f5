"""Rank 0's writer thread: it writes each step's events to the clients' sockets, so the step thread never does.

A write to a Unix socket wakes its reader as a hand-over: the reader (the API) takes the writing thread's
core at once, and the writer waits until it yields. The step thread must not be the one waiting: the time it
spends between two steps is on every token's path (mlx dispatches a step's work only a few operations ahead
of the computation). The step thread only queues a step's events (a wake that hands nothing over); this
thread writes them. Measured on one rank, one stream: the step thread's time between steps fell from
0.94 ms to 0.10 ms (median) when its writes moved here.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from engine.rank0.errors import generation_failed
from engine.rank0.outbox import Outbox

log = logging.getLogger(__name__)

STOP_SECONDS = 5.0  # how long stop() waits for the last events to be written


class WriterFailed(Exception):
    """The writer thread is gone: no client would hear of its request again, so the engine must end."""


class Writer:
    """Delivers what the step thread posts, in order: one write per generation, and steps that arrived while
    the last write was under way go out together. What cannot be written now (see Outbox) goes to hand_off,
    which passes it to the event loop."""

    def __init__(self, hand_off: Callable[[list], None], direct_limit: int | None = None):
        self.hand_off = hand_off
        self.direct_limit = direct_limit  # connections a step's events are written to directly (None: all)
        self.failure: BaseException | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="engine-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """After the step loop's last events: they are delivered, then the thread ends."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=STOP_SECONDS)

    def post(self, events: list) -> None:
        """Step thread: queue one step's (outbox, message) pairs and return at once; WriterFailed once the
        writer thread has died."""
        if self.failure is not None:
            raise WriterFailed(f"the engine's writer thread failed ({type(self.failure).__name__}: "
                               f"{self.failure}); no output can reach the clients")
        if events:
            self._queue.put(events)

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # the step loop hears of it at its next post
            log.critical("the writer thread failed", exc_info=True)
            self.failure = exc

    def _serve(self) -> None:
        while True:
            events = self._queue.get()
            end = events is None
            while not end:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    end = True
                else:
                    events.extend(more)
            if events:
                self.deliver(events)
            if end:
                return

    def deliver(self, events: list) -> None:
        by_outbox: dict[Outbox, list] = {}
        for outbox, msg in events:
            by_outbox.setdefault(outbox, []).append(msg)
        queued: list = []
        direct = self.direct_limit is None or len(by_outbox) <= self.direct_limit
        for outbox, msgs in by_outbox.items():
            try:
                outbox.deliver(msgs, queued, direct)
            except Exception:  # a bug: it costs this generation, no one else
                rid = msgs[0].request_id
                log.exception("delivering %d event(s) of request %s failed; ending it", len(msgs), rid)
                outbox.fail(generation_failed(rid, "the engine failed to deliver this request's output (see the "
                                                   "engine log); other requests are unaffected"), queued)
        if queued:
            self.hand_off(queued)
