"""The plan channel: plans from rank 0 to all ranks through mx.distributed.all_sum on fixed-size buffers.

A plan can be sent ahead (`post`, later `collect`): its first buffer's all_sum is queued beside the model's
work (engine/lockstep/beside.py: on the CPU stream the model's own all_sums take) before the next forward
pass, so it is summed as soon as the pass before it ends, and the ranks read it while that next pass
computes. Waiting for a plan after queuing a pass would otherwise make
every step wait for the previous one to finish before the next one's graph is even built.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from engine.lockstep import plan as plans
from engine.lockstep.beside import beside
from engine.lockstep.plan import Plan


@dataclass
class Pending:
    """A plan on its way: the first buffer's sum, queued; rank 0 also holds the plan itself."""

    first: mx.array | None
    plan: Plan | None


class PlanChannel:
    """Broadcasts plans from rank 0 to all ranks with fixed-size all_sum buffers."""

    def __init__(self, group: mx.distributed.Group | None, buffer_bytes: int, stream=None):
        # The model's stream (mlx-lm's generation stream, the GPU on a Mac): never handed to a collective, which
        # is built under it with no stream instead, so it queues behind the model's own all_sums on the CPU
        # stream they take (engine/lockstep/beside.py), in the same order on every rank.
        self.stream = stream
        self.group = group
        self.size = group.size() if group is not None else 1
        self.rank = group.rank() if group is not None else 0
        self.buffer_bytes = buffer_bytes
        self.collectives = 0

    def all_sum(self, buf: bytes) -> bytes:
        """One buffer of buffer_bytes summed over every rank."""
        with beside(self.stream):
            out = mx.distributed.all_sum(mx.array(np.frombuffer(buf, dtype=np.uint8)), group=self.group)
        mx.eval(out)
        self.collectives += 1
        return np.asarray(out).tobytes()

    def gather(self, row: list[int]) -> list[list[int]]:
        """Every rank contributes one row of int32s; every rank gets all rows (all_sum of disjoint rows)."""
        if self.size == 1:
            return [list(row)]
        table = np.zeros((self.size, len(row)), dtype=np.int32)
        table[self.rank] = row
        with beside(self.stream):
            out = mx.distributed.all_sum(mx.array(table), group=self.group)
        mx.eval(out)
        self.collectives += 1
        return np.asarray(out).tolist()

    def broadcast(self, plan: Plan | None) -> Plan:
        """Rank 0 passes its plan, the others None; every rank returns the same Plan."""
        if self.size == 1:
            assert plan is not None
            return plan
        if self.rank == 0:
            assert plan is not None
            plans.send(plan, self.all_sum, self.buffer_bytes)
            return plan
        return plans.receive(self.all_sum, self.buffer_bytes, self.rank)

    def post(self, plan: Plan | None) -> Pending:
        """Queue the plan's first buffer now (rank 0 passes the plan, the others None); `collect` it later."""
        if self.size == 1:
            assert plan is not None
            return Pending(None, plan)
        zeros = bytes(self.buffer_bytes)
        buf = next(plans.chunks(plan, self.buffer_bytes)) if self.rank == 0 else zeros
        with beside(self.stream):
            out = mx.distributed.all_sum(mx.array(np.frombuffer(buf, dtype=np.uint8)), group=self.group)
        mx.async_eval(out)
        self.collectives += 1
        return Pending(out, plan)

    def collect(self, pending: Pending) -> Plan:
        """The posted plan, every rank alike; a plan longer than one buffer sends the rest now."""
        if self.size == 1:
            return pending.plan
        mx.eval(pending.first)
        if self.rank == 0:
            plans.send(pending.plan, self.all_sum, self.buffer_bytes, skip_first=True)
            return pending.plan
        return plans.receive(self.all_sum, self.buffer_bytes, self.rank, first=np.asarray(pending.first).tobytes())
