"""The lockstep loop every rank runs: meet, apply the plan, step the batch together.

Only rank 0 decides. A rank waiting inside all_sum busy-waits a whole core, so an idle engine
never parks in a collective. With several ranks, rank 0 sends one idle plan when the work runs
out; the other ranks then sleep on the doorbell (engine/lockstep/doorbell.py) and rank 0 on its
inbound queue, and rank 0 rings them right before its next plan (work arrived, or shutdown).
Meanwhile the once-a-second rank reports travel over the doorbell's connections too. A single
rank meets no one. Rank 0 waits up to a second at a time, then looks at deadlines and reports, and
about once a minute wakes the ranks for a link probe (engine/lockstep/link_probe.py) carried by an idle plan.
"""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import dataclass

import msgspec

from engine.lockstep.batch import LockstepBatch
from engine.lockstep.channel import Pending, PlanChannel
from engine.lockstep.doorbell import RING, Bell, Doorbell
from engine.lockstep.link_probe import probe
from engine.lockstep.plan import Plan
from engine.lockstep.results import StepResults
from engine.rank0 import errors
from engine.rank0.links import LinkProbes, busy
from engine.rank0.scheduler import Scheduler, Submit, Withdraw
from engine.rank0.server import EngineServer
from engine.ranks import RankReports, local_row
from engine.speculative.propose import Proposer
from engine.watchdog import Watchdog

log = logging.getLogger(__name__)

# With a proposer and several ranks: after a round of proposals that found nothing, the next 1, 2, 4... plans (at
# most this many) are sent ahead again, undrafted, so plain chat keeps the overlap of plan and forward pass.
MAX_PLANS_AHEAD = 8

# How long an idle rank 0 waits on its inbound queue before looking at deadlines and reports again, and how
# long another rank sleeps on its doorbell between watchdog beats.
IDLE_WAIT_SECONDS = 1.0


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


class StepLoop:
    """One rank's loop; rank 0 also gets the scheduler, the socket server and their queue."""

    def __init__(self, batch: LockstepBatch, channel: PlanChannel, watchdog: Watchdog, drain_seconds: float,
                 doorbell: Doorbell | Bell | None = None, scheduler: Scheduler | None = None,
                 server: EngineServer | None = None, inbound: queue.SimpleQueue | None = None,
                 reports: RankReports | None = None, stats: LoopStats | None = None, links: LinkProbes | None = None,
                 proposer: Proposer | None = None, draft_tokens: int = 0):
        self.batch = batch
        self.channel = channel
        self.watchdog = watchdog
        self.doorbell = doorbell  # rank 0 rings it, the others sleep on it (None: a single rank)
        self.asleep = False  # rank 0: the other ranks got an idle plan and wait for the doorbell
        self.drain_seconds = drain_seconds  # DRAIN_TIMEOUT: in-flight requests get this long after a stop
        self.scheduler = scheduler
        self.server = server
        self.inbound = inbound
        self.reports = reports
        self.stats = stats if stats is not None else LoopStats()
        self.links = links  # the rank pairs a probe measures; rank 0 also schedules probes and keeps the figures
        self.rank = channel.rank
        self.stopping_since: float | None = None
        # rank 0, speculative decoding: what proposes drafts (None: plain decoding), and at most how many per sequence
        self.proposer = proposer
        self.draft_tokens = draft_tokens
        self.dry_rounds = 0  # consecutive rounds of proposals that found no draft
        self.plans_ahead = 0  # plans still to send ahead before proposing again
        self.drafting = True  # the last plan said the next one comes after the step (next_after)

    @property
    def step(self) -> int:
        return self.stats.step

    def request_stop(self) -> None:
        """Signal-safe: the next iteration starts draining (rank 0) or waits for rank 0's shutdown plan."""
        if self.stopping_since is None:
            self.stopping_since = time.monotonic()

    def run(self) -> None:
        if self.rank == 0:
            self._lead()
        else:
            self._follow()

    # -- followers -----------------------------------------------------------------------
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
                # rank 0 sends the next plan now, before this step's forward pass (see _lead)
                expected = self.batch.expect(plan.step + 1)
                pending = self.channel.post(None)
            # else it comes after this step, drafts continuing what the step samples: broadcast at the loop's top
            self.watchdog.beat(f"step {plan.step}")
            self.batch.step(drafts=plan.drafts)

    def _sleep(self, step: int) -> None:
        """Until rank 0 rings for its next plan, answering its report requests meanwhile."""
        while True:
            self.watchdog.beat("idle, waiting for rank 0's doorbell")
            kind = self.doorbell.wait(IDLE_WAIT_SECONDS)
            if kind == RING:
                return
            if kind is not None:
                self.doorbell.answer(local_row(step, self.batch.prefix.nbytes()))

    # -- rank 0 ------------------------------------------------------------------------
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
            if pending is not None:
                plan = self._collect(pending)
                pending = None
            else:
                # wait for work only once no other rank waits for a plan (they busy-wait in the collective)
                self._drain_inbound(block=not sched.has_work() and (single or self.asleep))
                now = time.monotonic()
                shutdown = self._drained(now)
                if not shutdown and not sched.has_work() and (single or self.asleep) and not self._probe_due(now):
                    server.post(sched.take_events())
                    self.batch.settle()
                    self.watchdog.beat("idle")
                    if self.reports is not None and self.reports.due(now):
                        row = local_row(self.step, self.batch.prefix.nbytes())
                        self.watchdog.beat("collecting the sleeping ranks' reports")  # a frozen rank stalls it here
                        self.reports.update([row] if single else self.doorbell.gather(row))
                    continue
                # with no work and the other ranks awake, this is the idle plan that puts them to sleep
                plan = self._next_plan(now, shutdown, after=True)
                if self.asleep:
                    self.watchdog.beat(f"ringing the doorbell for plan {plan.step}")
                    self.doorbell.ring()
                self._broadcast(plan)
            self.asleep = plan.idle and not single
            self.batch.apply(plan)
            if plan.stores or plan.evicts:
                # what the ranks now hold, measured on this rank's shard; over budget, the LRU go next plan
                sched.prefix.applied(self.batch.prefix.sizes())
            if plan.report:
                self.watchdog.beat(f"gathering rank reports at step {plan.step}")
                self.reports.update(self.channel.gather(local_row(plan.step, self.batch.prefix.nbytes())))
            if plan.probe:
                self._probe(plan)
            self.stats.step += 1
            if plan.shutdown:
                server.post(sched.take_events())
                log.info("rank 0: shutdown plan sent at step %d", plan.step)
                return
            if not plan.idle:
                if not single and not plan.next_after:
                    self._drain_inbound(block=False)
                    now = time.monotonic()
                    pending = self._post(self._next_plan(now, self._drained(now), after=False))
                self._step(plan)
            server.post(sched.take_events())

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
        if self.proposer is not None and not plan.idle and not plan.shutdown:
            # one rank keeps the schedule of several (drafted or not, step by step), so that a seeded sampled answer,
            # which depends on the drafts it was verified with, is the same on any number of ranks
            plan = self._speculate(plan, after and self.drafting)
            self.drafting = plan.next_after
        elif plan.idle:
            self.drafting = True  # from idle, the next plan is made when work comes
        return plan

    def _speculate(self, plan: Plan, after: bool) -> Plan:
        """Drafts for a plan made after the step, and how the next plan travels: after this step while proposals
        find drafts (or a sequence joins), else sent ahead for a few plans before proposing again."""
        for rid in plan.removes:  # the sequences that finish in a step are forgotten after it (_count_drafts)
            self.proposer.forget(rid)
        histories = self._histories(plan) if after else {}
        drafts = self._drafts(plan, histories) if histories else {}
        if plan.inserts:
            self.dry_rounds = self.plans_ahead = 0
        elif histories:  # a round of proposals (none while every sequence still prefills)
            self.dry_rounds = 0 if drafts else self.dry_rounds + 1
            self.plans_ahead = min(2 ** (self.dry_rounds - 1), MAX_PLANS_AHEAD) if self.dry_rounds else 0
        elif not after:
            self.plans_ahead = max(0, self.plans_ahead - 1)
        log.debug("plan %d, made %s the step: drafts for %d sequence(s), the next plan %s", plan.step,
                  "after" if after else "ahead of", len(drafts), "after" if self.plans_ahead == 0 else "ahead")
        return msgspec.structs.replace(plan, drafts=drafts, next_after=self.plans_ahead == 0)

    def _histories(self, plan: Plan) -> dict[str, list[int]]:
        """The sequences that decode in this plan's step: never one it removes, nor one still prefilling (it has
        no next input yet)."""
        gone = set(plan.removes)
        return {rid: h for rid, h in self.batch.histories().items() if rid not in gone}

    def _drafts(self, plan: Plan, histories: dict[str, list[int]]) -> dict[str, list[int]]:
        self.watchdog.beat(f"proposing drafts for plan {plan.step}")
        proposed = self.proposer.propose(histories, self.draft_tokens)
        return {rid: list(d[:self.draft_tokens]) for rid, d in proposed.items() if d and rid in histories}

    def _probe_due(self, now: float) -> bool:
        """Rank 0, idle: whether to wake the ranks for a link probe now."""
        return self.links is not None and self.links.due(now, busy(self.scheduler, self.inbound))

    def _probe(self, plan: Plan) -> None:
        """Every rank: measure the links this plan asks for; rank 0 keeps every rank's figures."""
        self.watchdog.beat(f"probing the links between ranks at step {plan.step}")
        row = probe(self.links.pairs, plan.probe, self.rank, self.channel.group, self.channel.stream)
        rows = self.channel.gather(row)
        if self.rank == 0:
            self.links.record(rows, plan.probe)

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
        if self.proposer is not None:
            self._count_drafts(plan, results)
        self.scheduler.absorb(results)

    def _count_drafts(self, plan: Plan, results: StepResults) -> None:
        """Speculation's figures for Info, and the proposer forgets the sequences that ended."""
        stats = self.stats
        if results.drafted:
            # what the step verified: drafts past a sequence's max_tokens, its KV room or its end were never judged
            stats.spec_proposed += results.proposed
            stats.spec_accepted += results.accepted
            stats.spec_forward_passes += len(results.drafted)
            stats.spec_emitted += sum(1 for rid, _, _ in results.tokens if rid in results.drafted)
        for rid, _, finish in results.tokens:
            if finish is not None:
                self.proposer.forget(rid)
        for rid in results.failed:
            self.proposer.forget(rid)

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
