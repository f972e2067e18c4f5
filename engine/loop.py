"""The lockstep loop every rank runs: meet, apply the plan, step the batch together.

Only rank 0 decides. An idle engine meets on a slow tick (IDLE_TICK_MS) instead of waiting
inside a collective, because a rank waiting in all_sum busy-waits a whole core.
"""

from __future__ import annotations

import logging
import queue
import time

import msgspec

from engine.batch import LockstepBatch
from engine.plan import PlanChannel
from engine.ranks import RankReports, local_row
from engine.scheduler import Scheduler
from engine.server import EngineServer, Submit, Withdraw
from engine.watchdog import Watchdog
from ipc import Error

log = logging.getLogger(__name__)

DRAIN_SECONDS = 10.0


class StepLoop:
    def __init__(self, batch: LockstepBatch, channel: PlanChannel, watchdog: Watchdog, idle_tick: float,
                 scheduler: Scheduler | None = None, server: EngineServer | None = None,
                 inbound: queue.SimpleQueue | None = None, reports: RankReports | None = None):
        self.batch = batch
        self.channel = channel
        self.watchdog = watchdog
        self.idle_tick = idle_tick
        self.scheduler = scheduler
        self.server = server
        self.inbound = inbound
        self.reports = reports
        self.rank = channel.rank
        self.step = 0
        self.stopping_since: float | None = None
        self.drain_seconds = DRAIN_SECONDS  # DRAIN_TIMEOUT: in-flight requests get this long after a stop
        self.steps_done = 0
        # Cumulative timings on rank 0 for Info (Prometheus rates them): forward steps, plan broadcasts.
        self.step_time_sum = 0.0
        self.step_time_count = 0
        self.broadcast_time_sum = 0.0
        self.broadcast_time_count = 0

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
        while True:
            self.watchdog.beat("waiting for rank 0's plan")
            plan = self.channel.broadcast(None)
            self.batch.verify(plan, self.rank)
            self.batch.apply(plan)
            if plan.report:
                self.channel.gather(local_row(plan.step))
            if plan.shutdown:
                log.info("rank %d: shutdown plan received at step %d", self.rank, plan.step)
                return
            if plan.idle:
                self.watchdog.beat("idle")
                time.sleep(self.idle_tick)
                continue
            self.watchdog.beat(f"step {plan.step}")
            self.batch.step()

    # -- rank 0 ------------------------------------------------------------------------
    def _lead(self) -> None:
        sched, server = self.scheduler, self.server
        assert sched is not None and server is not None and self.inbound is not None
        single = self.channel.size == 1
        while True:
            self._drain_inbound(block=not sched.has_work(), single=single)
            now = time.monotonic()
            sched.expire(now)
            shutdown = False
            if self.stopping_since is not None:
                server.accepting = False
                if not sched.has_work() or now - self.stopping_since > self.drain_seconds:
                    for rid in [*(r.rid for r in sched.waiting), *sched.running]:
                        sched.cancel(rid, Error(status=503, error_type="engine_unavailable", code="shutting_down",
                                                request_id=rid, message="the engine shut down before this request "
                                                "finished; retry when it is back"))
                    shutdown = True
            sched.step = self.step
            if not shutdown and not sched.has_work() and single:
                server.post(sched.take_events())
                self.watchdog.beat("idle")
                if self.reports is not None and self.reports.due(now):
                    self.reports.update([local_row(self.step)])
                continue
            plan = sched.next_plan(self.batch.fingerprint(self.step), self.batch.last_check,
                                   idle=not sched.has_work(), shutdown=shutdown)
            if not plan.idle:
                plan = msgspec.structs.replace(plan, prefill_chunk=self.batch.prefill_chunk(len(plan.inserts)))
            if self.reports is not None and self.reports.due(now) and not plan.shutdown:
                plan = msgspec.structs.replace(plan, report=True)
            self.watchdog.beat(f"broadcasting plan {plan.step}")
            t0 = time.perf_counter()
            self.channel.broadcast(plan)
            self.broadcast_time_sum += time.perf_counter() - t0
            self.broadcast_time_count += 1
            self.batch.apply(plan)
            if plan.report:
                self.watchdog.beat(f"gathering rank reports at step {plan.step}")
                self.reports.update(self.channel.gather(local_row(plan.step)))
            self.step += 1
            if plan.shutdown:
                server.post(sched.take_events())
                log.info("rank 0: shutdown plan sent at step %d", plan.step)
                return
            if plan.idle:
                server.post(sched.take_events())
                continue
            self.watchdog.beat(f"step {plan.step}")
            t0 = time.perf_counter()
            results = self.batch.step()
            self.step_time_sum += time.perf_counter() - t0
            self.step_time_count += 1
            sched.absorb(results)
            self.steps_done += 1
            server.post(sched.take_events())

    def _drain_inbound(self, block: bool, single: bool) -> None:
        """Move submissions and withdrawals into the scheduler; when idle, wait up to one tick."""
        timeout = (1.0 if single else self.idle_tick) if block else None
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
                self.scheduler.submit(item.request)
            elif isinstance(item, Withdraw):
                self.scheduler.cancel(item.rid)
