"""The batch every rank holds: mlx-lm's BatchGenerator driven only by broadcast plans."""

from __future__ import annotations

import logging

from mlx_lm.generate import BatchGenerator

from engine.plan import Plan, fingerprint, token_checksum
from engine.sampling import make_processors, make_sampler

log = logging.getLogger(__name__)


class DesyncError(RuntimeError):
    """This rank's batch differs from rank 0's: continuing would decode garbage."""


class StepResults(list):
    """A step's (request id, token, finish reason) tuples; logprob_rows maps the requests that asked
    for logprobs to their row of log probabilities over the vocabulary (an mx.array)."""

    def __init__(self) -> None:
        super().__init__()
        self.logprob_rows: dict = {}


class LockstepBatch:
    """Applies plans and runs steps; identical calls on every rank give identical state."""

    def __init__(self, model, eos_token_ids: set[int], prefill_tokens_per_step: int, max_batch: int):
        self.prefill_budget = prefill_tokens_per_step
        self.max_batch = max_batch
        self.gen = BatchGenerator(
            model,
            stop_tokens=[[t] for t in sorted(eos_token_ids)],
            completion_batch_size=max_batch,
            # Every admitted prompt joins the prefill batch at once (mlx-lm's default of 8
            # makes a short request wait behind eight long ones); chunk sizes come per step.
            prefill_batch_size=max_batch,
            prefill_step_size=prefill_tokens_per_step,
        )
        self.uid_of: dict[str, int] = {}
        self.rid_of: dict[int, str] = {}
        # Active request ids in insertion order: the batch composition the fingerprint covers.
        self.order: list[str] = []
        self.last_check = 0
        # Requests that asked for logprobs: step() hands rank 0 their rows.
        self.wants_logprobs: set[str] = set()

    def __len__(self) -> int:
        return len(self.order)

    def fingerprint(self, step: int) -> int:
        return fingerprint(step, self.order)

    def verify(self, plan: Plan, rank: int) -> None:
        """Followers: fail fast when the batch or the last sampled tokens differ from rank 0's."""
        mine = self.fingerprint(plan.step)
        if plan.fingerprint != mine:
            raise DesyncError(
                f"rank {rank}: batch fingerprint {mine:#010x} != rank 0's {plan.fingerprint:#010x} "
                f"at step {plan.step} (active here: {self.order})"
            )
        if plan.token_check != self.last_check:
            raise DesyncError(
                f"rank {rank}: sampled tokens differ from rank 0's at step {plan.step - 1} "
                f"(checksum {self.last_check:#010x} != {plan.token_check:#010x})"
            )

    def prefill_chunk(self, arriving: int) -> int:
        """Rank 0: tokens per prompt for the next step, so the step's prefill stays within budget."""
        gen = self.gen
        room = self.max_batch - len(gen._generation_batch)
        prefilling = len(gen._prompt_batch) + min(len(gen._unprocessed_sequences) + arriving, room)
        return max(16, self.prefill_budget // max(1, prefilling))

    def apply(self, plan: Plan) -> None:
        """Remove, then insert, exactly as the plan says."""
        if plan.prefill_chunk and plan.prefill_chunk != self.gen.prefill_step_size:
            # mlx-lm reads the chunk from both the generator and its current prompt batch.
            self.gen.prefill_step_size = plan.prefill_chunk
            self.gen._prompt_batch.prefill_step_size = plan.prefill_chunk
        if plan.removes:
            uids = [self.uid_of.pop(rid) for rid in plan.removes if rid in self.uid_of]
            if uids:
                self.gen.remove(uids)
            for uid in uids:
                self.rid_of.pop(uid, None)
            gone = set(plan.removes)
            self.order = [rid for rid in self.order if rid not in gone]
            self.wants_logprobs -= gone
        if plan.inserts:
            uids = self.gen.insert(
                [ins.tokens for ins in plan.inserts],
                max_tokens=[ins.max_tokens for ins in plan.inserts],
                samplers=[make_sampler(ins) for ins in plan.inserts],
                logits_processors=[make_processors(ins) for ins in plan.inserts],
            )
            for ins, uid in zip(plan.inserts, uids):
                self.uid_of[ins.rid] = uid
                self.rid_of[uid] = ins.rid
                self.order.append(ins.rid)
                if ins.logprobs:
                    self.wants_logprobs.add(ins.rid)

    def step(self) -> StepResults:
        """One batched forward step: (request id, sampled token, finish reason) per decoding request."""
        _, responses = self.gen.next()
        out = StepResults()
        finished = set()
        for r in responses:
            rid = self.rid_of[r.uid]
            out.append((rid, r.token, r.finish_reason))
            if rid in self.wants_logprobs:
                out.logprob_rows[rid] = r.logprobs  # already evaluated by mlx-lm; no copy
            if r.finish_reason is not None:
                finished.add(rid)
                del self.uid_of[rid]
                del self.rid_of[r.uid]
        if finished:
            self.order = [rid for rid in self.order if rid not in finished]
            self.wants_logprobs -= finished
        self.last_check = token_checksum([tok for _, tok, _ in out])
        return out
