"""Helper work on rank 0's step thread, in bounded slices between the served model's steps.

A job (one request's inputs, already tokenized and within the helper's max_tokens) waits in a queue; each slice
runs as many of its inputs as fit in `budget` tokens, padding included (every row of a batch is as long as its
longest), an input longer than the budget alone. Inputs run shortest first, so a batch pads little. While a
generation runs the loop takes one slice between two steps, so a step waits at most one slice for helper work;
idle, it takes slice after slice, looking for new requests between them.

No MLX here: helpers return arrays (mx or numpy) that numpy reads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

# the most rows one forward pass takes, whatever the budget (many tiny inputs)
MAX_ROWS = 256


@dataclass
class Job:
    """One request's inputs for one helper; done(result) is called once, on the step thread, with the embeddings
    ([n, dimensions] float32) or scores ([n]) in input order, or the exception that failed them."""

    helper: Any
    inputs: list[list[int]]
    done: Callable[[Any], None]
    scores: bool = False  # rerank: helper.score, else helper.embed
    cancelled: threading.Event = field(default_factory=threading.Event)
    _order: list[int] = field(default_factory=list)
    _next: int = 0
    _rows: dict[int, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._order = sorted(range(len(self.inputs)), key=lambda i: len(self.inputs[i]))

    @property
    def finished(self) -> bool:
        return self._next >= len(self._order)

    def take(self, budget: int) -> list[int]:
        """The next inputs (indices) whose padded batch fits budget tokens; at least one."""
        picked: list[int] = []
        while self._next < len(self._order) and len(picked) < MAX_ROWS:
            i = self._order[self._next]
            # shortest first: this input is the batch's longest, so the batch costs rows x its length
            if picked and (len(picked) + 1) * len(self.inputs[i]) > budget:
                break
            picked.append(i)
            self._next += 1
        return picked

    def result(self) -> np.ndarray:
        return np.stack([self._rows[i] for i in range(len(self.inputs))])


@dataclass
class HelperStats:
    inputs: int = 0
    tokens: int = 0  # padded tokens computed
    seconds: float = 0.0


class HelperWork:
    """The step thread's queue of helper jobs (the socket thread adds through the inbound queue)."""

    def __init__(self, budget: int, beat: Callable[[str], None] = lambda what: None):
        self.budget = budget  # HELPER_TOKENS_PER_STEP
        self.beat = beat  # the watchdog's: a slice is progress
        self.jobs: deque[Job] = deque()
        self.stats = HelperStats()

    def add(self, job: Job) -> None:
        self.jobs.append(job)

    def pending(self) -> bool:
        self._drop_cancelled()
        return bool(self.jobs)

    def run_slice(self) -> int:
        """One slice of the first job's inputs; the padded tokens it computed (0: nothing to do)."""
        if not self.pending():
            return 0
        job = self.jobs[0]
        picked = job.take(self.budget)
        batch = [job.inputs[i] for i in picked]
        cost = len(batch) * max(len(ids) for ids in batch)
        self.beat(f"helper work: {len(batch)} input(s), {cost} tokens")
        started = time.perf_counter()
        try:
            out = np.asarray(job.helper.score(batch) if job.scores else job.helper.embed(batch), dtype=np.float32)
        except Exception as exc:  # a bug or a broken model: this request fails, the engine serves on
            log.exception("helper %s failed on %d input(s)", getattr(job.helper, "name", "?"), len(batch))
            self.jobs.popleft()
            job.done(exc)
            return cost
        self.stats.seconds += time.perf_counter() - started
        self.stats.inputs += len(batch)
        self.stats.tokens += cost
        for i, row in zip(picked, out):
            job._rows[i] = row
        if job.finished:
            self.jobs.popleft()
            job.done(job.result())
        return cost

    def _drop_cancelled(self) -> None:
        while self.jobs and self.jobs[0].cancelled.is_set():
            self.jobs.popleft()
        if any(j.cancelled.is_set() for j in self.jobs):
            self.jobs = deque(j for j in self.jobs if not j.cancelled.is_set())
