"""Rank 0's step loop: the lockstep loop every rank runs (engine/lockstep/loop.py), with what only rank 0 ties
to the step: the scheduler that makes each plan, the socket server its events go to, the rank reports, the link
probe schedule (engine/rank0/links.py) and speculative proposals (engine/speculative).

Rank 0 waits up to a second at a time on its inbound queue, then looks at deadlines and reports, and about once
a minute wakes the ranks for a link probe carried by an idle plan.
"""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import dataclass

import msgspec

from engine.helpers.work import HelperWork, Job
from engine.lockstep.batch import LockstepBatch
from engine.lockstep.channel import Pending, PlanChannel
from engine.lockstep.doorbell import Bell, Doorbell
from engine.lockstep.loop import IDLE_WAIT_SECONDS, StepLoop
from engine.lockstep.plan import Plan
from engine.lockstep.results import StepResults
from engine.rank0 import errors
from engine.rank0.links import LinkProbes, busy
from engine.rank0.requests import Submit, Withdraw
from engine.rank0.scheduler import Scheduler
from engine.rank0.server import EngineServer
from engine.ranks import RankReports, local_row
from engine.speculative.propose import Proposer
from engine.speculative.schedule import DraftSchedule
from engine.watchdog import Watchdog

log = logging.getLogger(__name__)


@dataclass
class LoopStats:
    """Rank 0's progress for Info: the next step's number, and cumulative timings Prometheus rates
    (forward steps, plan broadcasts)."""

    step: int = 0
    step_time_sum: float = 0.0
    step_time_count: int = 0
    broadcast_time_sum: float = 0.0
    broadcast_time_count: int = 0
    # speculative decoding: draft tokens rank 0 proposed and the steps kept; a sequence's forward passes that verified
    # drafts (a step verifying three sequences' drafts counts three) and the tokens those sequences gained in them
    spec_proposed: int = 0
    spec_accepted: int = 0
    spec_forward_passes: int = 0
    spec_emitted: int = 0
    # decoding positions the forward passes computed (a plain step one per token it emitted), over every request:
    # / emitted tokens, what padding to the widest draft costs (1.0 without speculation)
    decode_positions: int = 0


class Leader(StepLoop):
    """Rank 0's loop: the scheduler, the socket server and their queue around the lockstep loop."""

    def __init__(self, batch: LockstepBatch, channel: PlanChannel, watchdog: Watchdog, drain_seconds: float,
                 doorbell: Doorbell | Bell | None = None, scheduler: Scheduler | None = None,
                 server: EngineServer | None = None, inbound: queue.SimpleQueue | None = None,
                 reports: RankReports | None = None, stats: LoopStats | None = None, links: LinkProbes | None = None,
                 proposer: Proposer | None = None, draft_tokens: int = 0, helpers: HelperWork | None = None):
        super().__init__(batch, channel, watchdog, doorbell, links.pairs if links is not None else ())
        self.asleep = False  # the other ranks got an idle plan and wait for the doorbell
        self.drain_seconds = drain_seconds  # DRAIN_TIMEOUT: in-flight requests get this long after a stop
        self.scheduler = scheduler
        self.server = server
        self.inbound = inbound
        self.reports = reports
        self.stats = stats if stats is not None else LoopStats()
        self.links = links  # the probe schedule and the figures of the last probe
        # speculative decoding: what proposes drafts (None: plain decoding), and at most how many per sequence
        self.proposer = proposer
        self.draft_schedule = DraftSchedule(proposer, draft_tokens, watchdog.beat) if proposer is not None else None
        self.drafting = True  # the last plan said the next one comes after the step (next_after)
        # embeddings and rerank: rank 0's own work, never in a plan; one bounded slice between two steps
        self.helpers = helpers if helpers is not None else HelperWork(0)

    @property
    def step(self) -> int:
        return self.stats.step

    def run(self) -> None:
        self._lead()

    def _lead(self) -> None:
        """Plan, send, apply, step. With several ranks the plan of step n+1 is made and sent before step n's
        forward pass is queued: its all_sum then runs between the two passes, and every rank reads it and
        builds pass n+1 while pass n computes, as mlx-lm's own loop does. Sending it after queuing pass n
        would make every rank wait for pass n to end before building the next one. The plan knows what
        rank 0 knew one step earlier: a new request joins a busy batch one step later; from idle, at once.
        With a proposer, plans say `next_after`: the next plan is made after this step, when the tokens its drafts
        continue are known, and broadcast then (engine/speculative)."""
        sched, server = self.scheduler, self.server
        assert sched is not None and server is not None and self.inbound is not None
        single = self.channel.size == 1
        pending: Pending | None = None
        while True:
            plan = self._collect(pending) if pending is not None else self._plan_after(single)
            pending = None
            if plan is None:
                self.helpers.run_slice()  # idle: the ranks sleep while rank 0 computes helper work
                continue  # idle: nothing to send yet
            self.asleep = plan.idle and not single
            self._apply(plan)
            self.stats.step += 1
            if plan.shutdown:
                server.post(sched.take_events())
                log.info("rank 0: shutdown plan sent at step %d", plan.step)
                return
            if not plan.idle:
                if not single and not plan.next_after:
                    pending = self._send_ahead()
                self._step(plan)
            server.post(sched.take_events())
            if not plan.idle:
                # Between two steps: a slice of helper work delays the next step by at most one slice
                # (HELPER_TOKENS_PER_STEP); the other ranks wait in the next plan's collective meanwhile.
                self.helpers.run_slice()

    def _plan_after(self, single: bool) -> Plan | None:
        """The plan made once the last step ended, sent to the ranks; None when there is none to send yet (waited
        up to IDLE_WAIT_SECONDS for work, looked after the idle engine)."""
        sched = self.scheduler
        # wait for work only once no other rank waits for a plan (they busy-wait in the collective), and no helper
        # work is left
        self._drain_inbound(block=not sched.has_work() and (single or self.asleep) and not self.helpers.pending())
        now = time.monotonic()
        shutdown = self._drained(now)
        if not shutdown and not sched.has_work() and (single or self.asleep) and not self._probe_due(now):
            self._idle(now, single)
            return None
        # with no work and the other ranks awake, this is the idle plan that puts them to sleep
        plan = self._next_plan(now, shutdown, after=True)
        if self.asleep:
            self.watchdog.beat(f"ringing the doorbell for plan {plan.step}")
            self.doorbell.ring()
        self._broadcast(plan)
        return plan

    def _send_ahead(self) -> Pending:
        """The next plan, made and sent before this step's forward pass (see _lead)."""
        self._drain_inbound(block=False)
        now = time.monotonic()
        return self._post(self._next_plan(now, self._drained(now), after=False))

    def _idle(self, now: float, single: bool) -> None:
        """Nothing to plan: the events so far go out, the batch settles, and the ranks report when that is due."""
        self.server.post(self.scheduler.take_events())
        self.batch.settle()
        self.watchdog.beat("idle")
        if self.reports is not None and self.reports.due(now):
            row = local_row(self.step, self.batch.prefix.nbytes())
            self.watchdog.beat("collecting the sleeping ranks' reports")  # a frozen rank stalls it here
            self.reports.update([row] if single else self.doorbell.gather(row))

    def _apply(self, plan: Plan) -> None:
        """Apply the plan as every rank does, and keep rank 0's view of what the ranks hold, report and measure."""
        if plan.stores:  # rank 0's files of the entries say their tokens and tenant (its disk index reads them back)
            self.batch.disk.headers.update(self.scheduler.disk.take_headers())
        self.batch.apply(plan)
        if plan.restores:
            self.scheduler.disk.restored(plan.restores, self.batch.disk.take_failed())
        if plan.stores or plan.evicts or plan.restores:
            # what the ranks now hold, measured on this rank's shard; over budget, the LRU go next plan
            prefix = self.batch.prefix
            self.scheduler.prefix.applied(prefix.sizes(), arrays=prefix.arrays, batch_arrays=self.batch.batch_arrays(),
                                          lengths=prefix.lengths)
        if plan.report:
            self.watchdog.beat(f"gathering rank reports at step {plan.step}")
            self.reports.update(self.channel.gather(local_row(plan.step, self.batch.prefix.nbytes())))
        if plan.probe:
            self.links.record(self._probe(plan), plan.probe)

    def _drained(self, now: float) -> bool:
        """While stopping: True once nothing is left, or the drain time is up (what is left ends with a 503)."""
        if self.stopping_since is None:
            return False
        sched = self.scheduler
        self.server.accepting = False
        if sched.has_work() and now - self.stopping_since <= self.drain_seconds:
            return False
        for rid in [*(r.rid for r in sched.waiting), *sched.running]:
            sched.cancel(rid, errors.shutting_down(rid, "the engine shut down before this request finished; "
                                                        "retry when it is back"))
        return True

    def _next_plan(self, now: float, shutdown: bool, after: bool) -> Plan:
        """after: made once the last step ended (not sent ahead of it), so drafts may continue its tokens."""
        sched = self.scheduler
        sched.expire(now)
        sched.step = self.step
        plan = sched.next_plan(self.batch.fingerprint(self.step), self.batch.last_check,
                               idle=not sched.has_work(), shutdown=shutdown)
        if not plan.idle:
            plan = msgspec.structs.replace(plan, prefill_chunk=self.batch.prefill_chunk(len(plan.inserts)))
        if self.reports is not None and self.reports.due(now) and not plan.shutdown:
            plan = msgspec.structs.replace(plan, report=True)
        if self.links is not None:
            plan = self.links.attach(plan, now, busy(sched, self.inbound))
        if self.draft_schedule is not None and not plan.idle and not plan.shutdown:
            # one rank keeps the schedule of several (drafted or not, step by step), so that a seeded sampled answer,
            # which depends on the drafts it was verified with, is the same on any number of ranks
            plan = self.draft_schedule.speculate(plan, after and self.drafting, self.batch.histories)
            self.drafting = plan.next_after
        elif plan.idle:
            self.drafting = True  # from idle, the next plan is made when work comes
        return plan

    def _probe_due(self, now: float) -> bool:
        """Rank 0, idle: whether to wake the ranks for a link probe now."""
        return self.links is not None and self.links.due(now, busy(self.scheduler, self.inbound))

    def _broadcast(self, plan: Plan) -> None:
        self.watchdog.beat(f"broadcasting plan {plan.step}")
        t0 = time.perf_counter()
        self.channel.broadcast(plan)
        self.stats.broadcast_time_sum += time.perf_counter() - t0
        self.stats.broadcast_time_count += 1

    def _post(self, plan: Plan) -> Pending:
        self.watchdog.beat(f"sending plan {plan.step} ahead")
        t0 = time.perf_counter()
        pending = self.channel.post(plan)
        self.stats.broadcast_time_sum += time.perf_counter() - t0
        return pending

    def _collect(self, pending: Pending) -> Plan:
        self.watchdog.beat(f"collecting plan {pending.plan.step}")
        t0 = time.perf_counter()
        plan = self.channel.collect(pending)
        self.stats.broadcast_time_sum += time.perf_counter() - t0
        self.stats.broadcast_time_count += 1
        return plan

    def _step(self, plan: Plan) -> None:
        self.watchdog.beat(f"step {plan.step}")
        t0 = time.perf_counter()
        results = self.batch.step(drafts=plan.drafts)
        self.stats.step_time_sum += time.perf_counter() - t0
        self.stats.step_time_count += 1
        self.stats.decode_positions += results.positions or len(results.tokens)
        if self.proposer is not None:
            self._count_drafts(plan, results)
        self.scheduler.absorb(results)

    def _count_drafts(self, plan: Plan, results: StepResults) -> None:
        """Speculation's figures for Info, each sequence's next draft length, and the schedule forgets the
        sequences that ended."""
        stats = self.stats
        if results.drafted:
            self.draft_schedule.judged(plan.drafts, results.tokens, results.drafted)
            # what the step verified: drafts past a sequence's max_tokens, its KV room or its end were never judged
            stats.spec_proposed += results.proposed
            stats.spec_accepted += results.accepted
            stats.spec_forward_passes += len(results.drafted)
            stats.spec_emitted += sum(1 for rid, _, _ in results.tokens if rid in results.drafted)
        for rid, _, finish in results.tokens:
            if finish is not None:
                self.draft_schedule.forget(rid)
        for rid in results.failed:
            self.draft_schedule.forget(rid)

    def _drain_inbound(self, block: bool) -> None:
        """Move submissions and withdrawals into the scheduler. With block (no work), wait for the first
        one up to IDLE_WAIT_SECONDS, except while stopping."""
        timeout = IDLE_WAIT_SECONDS if block else None
        first = True
        while True:
            try:
                if first and timeout is not None and self.stopping_since is None:
                    item = self.inbound.get(timeout=timeout)
                else:
                    item = self.inbound.get_nowait()
            except queue.Empty:
                return
            first = False
            if isinstance(item, Submit):
                self.scheduler.submit(item.requests)
            elif isinstance(item, Withdraw):
                self.scheduler.cancel(item.rid)
            elif isinstance(item, Job):
                self.helpers.add(item)
