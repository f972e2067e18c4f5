"""The lockstep loop every rank runs: meet, apply the plan, step the batch together.

Only rank 0 decides; its loop (engine/leader.py) builds on this one. A rank waiting inside all_sum busy-waits
a whole core, so an idle engine never parks in a collective. With several ranks, rank 0 sends one idle plan
when the work runs out; the other ranks then sleep on the doorbell (engine/lockstep/doorbell.py) and rank 0 on
its inbound queue, and rank 0 rings them right before its next plan (work arrived, or shutdown).
Meanwhile the once-a-second rank reports travel over the doorbell's connections too. A single
rank meets no one. A plan may ask every rank to probe the links between ranks (engine/lockstep/link_probe.py).
"""

from __future__ import annotations

import logging
import time

from engine.helpers.inbox import HelperInbox
from engine.lockstep.batch import LockstepBatch
from engine.lockstep.channel import Pending, PlanChannel
from engine.lockstep.doorbell import RING, Bell, Doorbell
from engine.lockstep.link_probe import probe
from engine.lockstep.plan import Plan
from engine.ranks import local_row
from engine.watchdog import Watchdog

log = logging.getLogger(__name__)

# How long an idle rank 0 waits on its inbound queue before looking at deadlines and reports again, and how
# long another rank sleeps on its doorbell between watchdog beats.
IDLE_WAIT_SECONDS = 1.0


class StepLoop:
    """One rank's loop as every rank but rank 0 runs it; rank 0's (engine/leader.py) makes the plans."""

    def __init__(self, batch: LockstepBatch, channel: PlanChannel, watchdog: Watchdog,
                 doorbell: Doorbell | Bell | None = None, pairs: list[tuple[int, int]] = (),
                 side: HelperInbox | None = None):
        self.batch = batch
        self.channel = channel
        self.watchdog = watchdog
        self.doorbell = doorbell  # rank 0 rings it, the others sleep on it (None: a single rank)
        self.pairs = list(pairs)  # the rank pairs a link probe measures (engine/lockstep/link_pairs.py)
        self.rank = channel.rank
        self.stopping_since: float | None = None
        # helper models pinned on this rank (HELPER_RANK): their work, never in a plan, one bounded slice between two
        # steps and slice after slice while asleep (None: this rank serves none)
        self.side = side

    def request_stop(self) -> None:
        """Signal-safe: the next iteration starts draining (rank 0) or waits for rank 0's shutdown plan."""
        if self.stopping_since is None:
            self.stopping_since = time.monotonic()

    def run(self) -> None:
        self._follow()

    def _follow(self) -> None:
        pending: Pending | None = None  # the next plan, sent ahead of the step in flight
        expected = None  # what that plan must carry: the batch as it was when rank 0 made it
        while True:
            self.watchdog.beat("waiting for rank 0's plan")
            plan = self.channel.broadcast(None) if pending is None else self.channel.collect(pending)
            self.batch.verify(plan, self.rank, expected)
            pending = expected = None
            self.batch.apply(plan)
            if plan.report:
                self.channel.gather(local_row(plan.step, self.batch.prefix.nbytes()))
            if plan.probe:
                self._probe(plan)
            if plan.shutdown:
                log.info("rank %d: shutdown plan received at step %d", self.rank, plan.step)
                return
            if plan.idle:
                self._sleep(plan.step)
                continue
            if not plan.next_after:
                # rank 0 sends the next plan now, before this step's forward pass (engine/leader.py: Leader._lead)
                expected = self.batch.expect(plan.step + 1)
                pending = self.channel.post(None)
            # else it comes after this step, drafts continuing what the step samples: broadcast at the loop's top
            self.watchdog.beat(f"step {plan.step}")
            self.batch.step(drafts=plan.drafts, chain=plan.chain)
            if self.side is not None and self.side.pending():
                # rank 0 and the other ranks wait in the next plan's collective meanwhile: at most one slice
                # (HELPER_TOKENS_PER_STEP), as rank 0's own helper work delays a step
                self.side.run_slice()

    def _sleep(self, step: int) -> None:
        """Until rank 0 rings for its next plan, answering its report requests meanwhile."""
        while True:
            self.watchdog.beat("idle, waiting for rank 0's doorbell")
            if self.side is None:
                kind = self.doorbell.wait(IDLE_WAIT_SECONDS)
            else:  # helper work: a slice at a time, the doorbell looked at between them (rank 0 waits one at most)
                busy = self.side.pending()
                kind = self.doorbell.wait(0.0 if busy else IDLE_WAIT_SECONDS, wake=self.side.fileno())
                if kind is None and busy:
                    self.side.run_slice()
            if kind == RING:
                return
            if kind is not None:
                self.doorbell.answer(local_row(step, self.batch.prefix.nbytes()))

    def _probe(self, plan: Plan) -> list[list[int]]:
        """Every rank: measure the links this plan asks for; every rank's figures, gathered."""
        self.watchdog.beat(f"probing the links between ranks at step {plan.step}")
        row = probe(self.pairs, plan.probe, self.rank, self.channel.group, self.channel.stream)
        return self.channel.gather(row)
