"""Rank 0's decisions: admission, step plans, and turning sampled tokens into client events."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ipc import Delta, Error, Finish

from engine.plan import Insert, Plan

log = logging.getLogger(__name__)


@dataclass
class Request:
    """A generation as rank 0 tracks it, from submission to its last event."""

    insert: Insert
    outbox: Any  # anyio MemoryObjectSendStream, written only on the server's event loop
    prompt_tokens: int
    stop: list[str]
    deadline: float
    detok: Any
    completion_tokens: int = 0
    sent: str = ""  # text already sent to the client
    pending: str = ""  # decoded text held back while it may begin a stop string
    done: bool = False

    @property
    def rid(self) -> str:
        return self.insert.rid


@dataclass
class Counters:
    """Shared with the socket thread: how many requests wait and run."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    waiting: int = 0
    active: int = 0


class Scheduler:
    """Builds each step's plan and converts its results into Delta/Finish/Error events."""

    def __init__(self, max_batch: int, eos_token_ids: set[int], counters: Counters):
        self.max_batch = max_batch
        self.eos = eos_token_ids
        self.counters = counters
        self.waiting: deque[Request] = deque()
        self.running: dict[str, Request] = {}
        self.to_remove: list[str] = []
        self.step = 0
        self.events: list[tuple[Any, Any]] = []

    def submit(self, req: Request) -> None:
        self.waiting.append(req)

    def cancel(self, rid: str, reason: Error | None = None) -> None:
        """Drop a request wherever it is; its client gets `reason` if one is given."""
        for req in self.waiting:
            if req.rid == rid:
                self.waiting.remove(req)
                self._left_queue(1)
                self._close(req, reason)
                return
        req = self.running.get(rid)
        if req is not None and not req.done:
            self._close(req, reason)
            self.to_remove.append(rid)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.to_remove)

    def expire(self, now: float) -> None:
        """Requests past REQUEST_TIMEOUT end with an error, in any phase."""
        for req in [r for r in (*self.waiting, *self.running.values()) if r.deadline < now and not r.done]:
            self.cancel(
                req.rid,
                Error(status=504, error_type="timeout", code="request_timeout", request_id=req.rid,
                      message="the request exceeded REQUEST_TIMEOUT before it finished; raise REQUEST_TIMEOUT "
                              "or ask for fewer tokens"),
            )

    def next_plan(self, fingerprint: int, token_check: int, *, idle: bool = False, shutdown: bool = False) -> Plan:
        inserts = []
        while self.waiting and len(self.running) + len(inserts) < self.max_batch and not shutdown:
            req = self.waiting.popleft()
            self.running[req.rid] = req
            inserts.append(req.insert)
        if inserts:
            self._left_queue(len(inserts))
        removes, self.to_remove = self.to_remove, []
        for rid in removes:
            self.running.pop(rid, None)
        self._count()
        return Plan(step=self.step, fingerprint=fingerprint, token_check=token_check,
                    inserts=inserts, removes=removes, idle=idle and not inserts and not removes,
                    shutdown=shutdown)

    def absorb(self, results: list[tuple[str, int, str | None]]) -> None:
        """Turn one step's sampled tokens into client events."""
        for rid, token, finish in results:
            req = self.running.get(rid)
            if req is None:
                continue
            if finish is not None:
                self.running.pop(rid)  # the batch already dropped it on every rank
            if req.done:
                continue
            req.completion_tokens += 1
            if not (finish == "stop" and token in self.eos):
                req.detok.add_token(token)
            if finish is not None:
                req.detok.finalize()
            req.pending += req.detok.last_segment
            hit = self._match_stop(req)
            if hit or finish is not None:
                self._flush(req)
                self._close(req, None, "stop" if hit else finish)
                if hit and finish is None:
                    self.to_remove.append(rid)
            else:
                self._flush(req, holdback=True)
        self._count()

    def _match_stop(self, req: Request) -> bool:
        """Cut the text at the first stop string; it is never sent."""
        if not req.stop:
            return False
        cuts = [i for i in (req.pending.find(s) for s in req.stop) if i >= 0]
        if not cuts:
            return False
        req.pending = req.pending[: min(cuts)]
        return True

    def _flush(self, req: Request, holdback: bool = False) -> None:
        text = req.pending
        keep = 0
        if holdback and req.stop:
            # Keep back a tail that could still grow into a stop string across tokens.
            for s in req.stop:
                for k in range(min(len(s) - 1, len(text)), 0, -1):
                    if s.startswith(text[-k:]):
                        keep = max(keep, k)
                        break
        out, req.pending = (text[: len(text) - keep], text[len(text) - keep :]) if keep else (text, "")
        if out:
            req.sent += out
            self.events.append((req.outbox, Delta(request_id=req.rid, text=out,
                                                  completion_tokens=req.completion_tokens)))

    def _close(self, req: Request, error: Error | None, finish: str | None = None) -> None:
        req.done = True
        if error is not None:
            self.events.append((req.outbox, error))
        elif finish is not None:
            self.events.append((req.outbox, Finish(request_id=req.rid, finish_reason=finish,
                                                   prompt_tokens=req.prompt_tokens,
                                                   completion_tokens=req.completion_tokens)))

    def take_events(self) -> list[tuple[Any, Any]]:
        events, self.events = self.events, []
        return events

    def _left_queue(self, n: int) -> None:
        # The socket thread adds to `waiting` on admission; requests leave it here.
        with self.counters.lock:
            self.counters.waiting -= n

    def _count(self) -> None:
        self.counters.active = len(self.running)
