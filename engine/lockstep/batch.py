"""The batch every rank holds: mlx-lm's BatchGenerator driven only by broadcast plans."""

from __future__ import annotations

import logging

import mlx.core as mx
from mlx_lm.generate import BatchGenerator

from engine import mlx_compat
from engine.decoding.constrained import GrammarFailed, Grammars
from engine.decoding.sampling import failpoint_seed, make_processors, make_sampler
from engine.lockstep.boundaries import Boundaries
from engine.lockstep.buffers import cache_arrays
from engine.lockstep.disk import DiskEntries
from engine.lockstep.plan import Plan, Restore, Store, fingerprint, token_checksum
from engine.lockstep.prefix import PrefixEntries, model_cuts
from engine.lockstep.prompt_logprobs import PromptLogprobs
from engine.lockstep.results import StepResults
from engine.speculative.rollback import can_verify
from engine.speculative.verify import verify
from engine.vision.ids import carried
from engine.vision.mrope import attach as attach_positions
from engine.vision.table import FeatureTable

log = logging.getLogger(__name__)


class DesyncError(RuntimeError):
    """This rank's batch differs from rank 0's: continuing would decode garbage."""


class _Guard:
    """Runs one request's sampler or logits processor; an exception marks that request failed instead
    of ending the step (and with it every rank), and the fallback keeps the batch's shapes."""

    __slots__ = ("fn", "rid", "failures", "fallback")

    def __init__(self, fn, rid: str, failures: dict[str, str], fallback):
        self.fn, self.rid, self.failures, self.fallback = fn, rid, failures, fallback

    def __call__(self, *args):
        try:
            return self.fn(*args)
        except Exception as exc:
            _failed(self.rid, exc, self.failures)
            return self.fallback(*args)


def _failed(rid: str, exc: Exception, failures: dict[str, str]) -> None:
    """Mark a request failed by its own sampling (logged once)."""
    if rid not in failures:
        if isinstance(exc, GrammarFailed):  # the client's grammar, not the engine, gave out
            log.warning("request %s: %s; ending it", rid, exc)
        else:
            log.exception("request %s: its sampling raised; ending it", rid, exc_info=exc)
        failures[rid] = _reason(exc)


def _argmax(logprobs):
    return mx.argmax(logprobs, axis=-1)


def _unchanged(tokens, logits):
    return logits


def _segments(ins, reused: int) -> list[list[int]]:
    """The prompt tokens a sequence computes, in segments mlx-lm pauses between: split where a state is kept."""
    if reused < ins.keep_at < len(ins.tokens):
        return [ins.tokens[reused:ins.keep_at], ins.tokens[ins.keep_at:]]
    return [ins.tokens[reused:]]


def _valid(draft: list[int], vocab: int) -> list[int]:
    """The draft up to its first token the model has no embedding for."""
    for n, token in enumerate(draft):
        if not 0 <= token < vocab:
            return list(draft[:n])
    return list(draft)


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


class LockstepBatch:
    """Applies plans and runs steps; identical calls on every rank give identical state."""

    def __init__(self, model, eos_token_ids: set[int], prefill_tokens_per_step: int, max_batch: int,
                 grammars: Grammars | None = None, images: FeatureTable | None = None):
        self.model = model
        # the running requests' image features, which the model's embedding reads (engine/vision/table.py)
        self.images = images if images is not None else FeatureTable()
        self.grammars = grammars  # without them, a request with a grammar fails alone
        self.eos = eos_token_ids
        self.prefill_budget = prefill_tokens_per_step
        self.max_batch = max_batch
        # Sequences whose prompt's logprobs were asked (completions with echo and logprobs): every rank computes
        # them in the prefill passes (engine/lockstep/prompt_logprobs.py)
        self.prompt_logprobs = PromptLogprobs()
        self.gen = self._generator()
        self.uid_of: dict[str, int] = {}
        self.rid_of: dict[int, str] = {}
        # Active request ids in insertion order: the batch composition the fingerprint covers.
        self.order: list[str] = []
        self.last_check = 0
        # Requests that asked for logprobs: step() hands rank 0 their rows.
        self.wants_logprobs: set[str] = set()
        # Requests ended since the last step because generating them raised: rid -> reason.
        self.failed: dict[str, str] = {}
        # Prompt tokens each sequence inserted since the last step took from the prefix cache (StepResults.reused)
        self.reused: dict[str, int] = {}
        self._fail_seed = failpoint_seed("step")
        self._seeded: set[str] = set()  # requests carrying the failpoint's seed
        # The prefix cache's entries on this rank, and what they are built from: the inserts that asked to
        # be kept, and the caches of those that ended in the last step (with the tokens they fed), until the
        # next plan stores or drops them.
        self.prefix = PrefixEntries(model_cuts(model))
        self.disk = DiskEntries()  # its disk tier: stores written through, restores loaded (engine/lockstep/disk.py)
        self.keep: set[str] = set()
        self.ended: dict[str, tuple[list, int]] = {}
        # ...kept through one more plan: a plan sent ahead was made before rank 0 saw them end
        self.ended_before: dict[str, tuple[list, int]] = {}
        # states at a prompt's end or a shared prefix's (Insert.keep_prompt, keep_at), until a plan stores them
        self.boundaries = Boundaries()
        # Whether this model's caches can drop rejected drafts per sequence (engine/speculative/rollback.py)
        self.verifies = can_verify(model)[0]
        # SPECULATIVE=mtp (engine/speculative/mtp_model.py): drafts its heads chain after each step, this many deep;
        # rank 0's MtpProposer reads them (request id -> [the next input they follow, drafts...])
        self.chain_tokens = 0
        self.mtp_drafts: dict[str, list[int]] = {}
        # token ids past it index past the embedding: a draft is cut there (a draft model may have a larger vocabulary)
        self.vocab = getattr(getattr(model, "args", None), "vocab_size", None) or 1 << 31

    def _generator(self) -> BatchGenerator:
        gen = BatchGenerator(
            self.model,
            stop_tokens=[[t] for t in sorted(self.eos)],
            completion_batch_size=self.max_batch,
            # Every admitted prompt joins the prefill batch at once (mlx-lm's default of 8
            # makes a short request wait behind eight long ones); chunk sizes come per step.
            prefill_batch_size=self.max_batch,
            prefill_step_size=self.prefill_budget,
        )
        mlx_compat.tap_prefill(gen, self.prompt_logprobs.on_logits)
        attach_positions(gen, self.images)  # a family whose images change positions (M-RoPE)
        return gen

    def reset(self, reason: str) -> None:
        """Drop every request (all ranks do the same, at the same step): a failure left the generator unusable."""
        log.error("the batch failed (%s); ending its %d request(s) and continuing with a fresh batch",
                  reason, len(self.order))
        for rid in self.order:
            self.failed.setdefault(rid, reason)
        try:
            self.gen.close()
        except Exception:  # the old generator may be half-updated; its state is discarded either way
            log.debug("closing the failed generator raised", exc_info=True)
        self.prompt_logprobs = PromptLogprobs()
        self.gen = self._generator()
        self.uid_of.clear()
        self.rid_of.clear()
        self.order = []
        self.wants_logprobs.clear()
        self._seeded.clear()
        self.keep.clear()
        self.ended.clear()
        self.ended_before.clear()
        self.boundaries.clear()

    def __len__(self) -> int:
        return len(self.order)

    def fingerprint(self, step: int) -> int:
        return fingerprint(step, self.order, self.prefix.ids())

    def expect(self, step: int) -> tuple[int, int, int, list[str]]:
        """What plan `step` must carry if rank 0 makes it now: (step, fingerprint, token check, batch)."""
        return step, self.fingerprint(step), self.last_check, list(self.order)

    def verify(self, plan: Plan, rank: int, expected: tuple[int, int, int, list[str]] | None = None) -> None:
        """Followers: fail fast when the batch or the last sampled tokens differ from rank 0's (as they were
        when rank 0 made the plan: now, or, for a plan sent ahead, when `expected` was taken)."""
        step, mine, check, order = expected if expected is not None else self.expect(plan.step)
        if plan.step != step:
            raise DesyncError(f"rank {rank}: received plan {plan.step} where plan {step} was due")
        if plan.fingerprint != mine:
            raise DesyncError(
                f"rank {rank}: batch fingerprint {mine:#010x} != rank 0's {plan.fingerprint:#010x} "
                f"at step {plan.step} (active here: {order})"
            )
        if plan.token_check != check:
            raise DesyncError(
                f"rank {rank}: sampled tokens differ from rank 0's at step {plan.step - 1} "
                f"(checksum {check:#010x} != {plan.token_check:#010x})"
            )

    def prefill_chunk(self, arriving: int) -> int:
        """Rank 0: tokens per prompt for the next step, so the step's prefill stays within budget."""
        decoding, prefilling, unprocessed = mlx_compat.batch_occupancy(self.gen)
        room = self.max_batch - decoding
        prefilling += min(unprocessed + arriving, room)
        # at least a token each, never a floor above the budget: a budget paced to a slow host (engine/prefill_pace.py)
        # split over many prompts must keep the step within the watchdog's deadline
        return max(1, self.prefill_budget // max(1, prefilling))

    def apply(self, plan: Plan) -> None:
        """Store, remove, insert, then evict, exactly as the plan says."""
        if plan.prefill_chunk and plan.prefill_chunk != self.gen.prefill_step_size:
            mlx_compat.set_prefill_chunk(self.gen, plan.prefill_chunk)
        gone = set(plan.removes)
        if plan.disk_deletes:  # before the stores: a name deleted and stored again in one plan is stored
            self.disk.delete(plan.disk_deletes)
        removed_stores = self._store(plan.stores, gone)
        stored = {s.rid for s in plan.stores}
        self.ended_before = {rid: c for rid, c in self.ended.items() if rid not in stored}
        self.ended = {}
        self.boundaries.age()
        if plan.removes:
            uids = [self.uid_of.pop(rid) for rid in plan.removes if rid in self.uid_of]
            if uids:
                kept = [self.rid_of.get(uid, "") for uid in uids]
                try:
                    caches = self.gen.remove(uids, return_prompt_caches=any(r in removed_stores for r in kept))
                except Exception as exc:
                    caches = {}
                    self.reset(_reason(exc))
                for uid, rid in zip(uids, kept):
                    if rid in removed_stores and uid in caches:
                        cache, tokens = caches[uid]
                        st = removed_stores[rid]
                        self._put(st, cache, st.keeps(len(tokens)), len(tokens))
            for uid in uids:
                self.rid_of.pop(uid, None)
            self.prompt_logprobs.forget(uids)
            self.order = [rid for rid in self.order if rid not in gone]
            self.wants_logprobs -= gone
            self.keep -= gone
            for rid in gone:
                self.boundaries.forget(rid)
        if plan.restores:
            self._restore(plan.restores)
        if plan.inserts:
            self._insert(plan.inserts)
        if plan.evicts:
            self.prefix.evict(plan.evicts)
        if plan.idle:
            self.settle()
        self.images.keep_only(set(self.order))

    def batch_arrays(self) -> int:
        """The arrays (Metal buffers) the running batch's caches hold on this rank."""
        return sum(cache_arrays(c) for c in mlx_compat.batch_caches(self.gen))

    def live_arrays(self) -> int:
        """The arrays the batch and the prefix cache hold on this rank (what MAX_LIVE_BUFFERS bounds)."""
        return self.batch_arrays() + sum(self.prefix.arrays.values())

    def settle(self) -> None:
        """The engine has gone idle (every rank at the same plan; a single rank whenever it waits for work):
        every store rank 0 wanted has been applied, so the states held for stores that never came go now. Held
        on, they would stay until the next request, each a slice pinning a whole batch buffer the prefix cache
        does not count."""
        self.ended.clear()
        self.ended_before.clear()
        self.boundaries.clear()
        self.disk.settle()

    def _put(self, st: Store, cache, length: int, have: int) -> None:
        """Keep a store's cache as its entry, and write the entry as kept through to the disk tier."""
        self.prefix.put(st.entry, cache, length, have)
        if st.disk:
            self.disk.stored(st.disk, self.prefix.entries.get(st.entry), self.prefix.lengths.get(st.entry, 0),
                             st.replaces)

    def _restore(self, restores: list[Restore]) -> None:
        """Load each restored entry from this rank's disk tier, then keep only those every rank loaded (one
        collective, made in every plan that restores: every rank reads the plan); the others are dropped on every
        rank, and the inserts naming them compute their prompts."""
        for r in restores:
            try:
                self.prefix.put(r.entry, self.disk.load(r.name), r.length, r.length)
            except Exception:  # a file of another shape than this model's caches: as damaged
                log.exception("disk entry %s could not be restored", r.name)
                self.prefix.evict([r.entry])
        for r, ok in zip(restores, self.disk.agreed([r.entry in self.prefix.entries for r in restores])):
            if not ok:
                self.prefix.evict([r.entry])
                self.disk.failed.append(r.name)

    def _store(self, stores, gone: set[str]) -> dict[str, Store]:
        """Keep what the plan's stores name, each from the state holding exactly its tokens where one is held (a
        prompt's end, a sequence that ended), else from the running sequence; the stores of sequences this plan
        removes are returned, for their caches to come from the removal. A cache serves one store (keeping it
        cuts and compacts it): a second store of the same sequence's cache is dropped, as on every rank."""
        ended = {**self.ended_before, **self.ended}
        removed: dict[str, Store] = {}
        for st in stores:
            held = self.boundaries.pop(st.rid, st.length)
            if held is not None:
                self._put(st, held, st.length, st.length)
            elif st.rid in ended:
                cache, fed = ended.pop(st.rid)
                self._put(st, cache, st.keeps(fed), fed)
            elif st.rid in gone:
                removed.setdefault(st.rid, st)
            elif st.rid in self.uid_of:
                self._snapshot(st)  # a running sequence whose prompt others wait for: a copy of its KV so far
        return removed

    def _snapshot(self, st) -> None:
        uid = self.uid_of[st.rid]
        try:
            caches = self.gen.extract_cache([uid])
        except Exception:  # the same on every rank: the entry is missing everywhere, and rank 0 forgets it
            log.exception("request %s: its KV could not be copied for the prefix cache", st.rid)
            return
        if uid in caches:
            cache, tokens = caches[uid]
            self._put(st, cache, st.keeps(len(tokens)), len(tokens))

    def _insert(self, inserts) -> None:
        """Insert what can be built; a request whose sampler or grammar cannot be made fails alone."""
        ready, samplers, processors = [], [], []
        for ins in inserts:
            if ins.rid in self.uid_of:  # rank 0 never plans this; a second sequence would orphan the first
                self.failed[ins.rid] = "another sequence already runs under this request id"
                continue
            if ins.cache_len and ins.cache_id not in self.prefix.entries and not carried(ins.images, ins.tokens):
                # its images' features stayed on rank 0 for the entry's KV, and no rank kept that entry
                self.failed[ins.rid] = "its prefix cache entry is gone with its images' features; send it again"
                continue
            try:
                sampler, procs = make_sampler(ins), make_processors(ins, self.grammars)
            except Exception as exc:
                log.exception("request %s: its sampler could not be built; ending it", ins.rid)
                self.failed[ins.rid] = _reason(exc)
                continue
            ready.append(ins)
            samplers.append(None if sampler is None else _Guard(sampler, ins.rid, self.failed, _argmax))
            processors.append([_Guard(p, ins.rid, self.failed, _unchanged) for p in procs])
        if not ready:
            return
        for ins in ready:
            self.images.add(ins.rid, ins.images)
        try:
            # a sequence starting from a prefix entry computes only the tokens after it
            # (an entry the ranks did not keep is missing on every rank alike: the whole prompt is computed)
            reuse = [ins.cache_len if ins.cache_id in self.prefix.entries else 0 for ins in ready]
            caches = [self.prefix.take(ins.cache_id, n) if n else None for ins, n in zip(ready, reuse)]
            uids = self.gen.insert_segments([_segments(ins, n) for ins, n in zip(ready, reuse)],
                                            max_tokens=[ins.max_tokens for ins in ready], caches=caches,
                                            all_tokens=[ins.tokens[:n] for ins, n in zip(ready, reuse)],
                                            samplers=samplers, logits_processors=processors)
        except Exception as exc:
            for ins in ready:
                self.failed[ins.rid] = _reason(exc)
            self.reset(_reason(exc))
            return
        for ins, uid, n in zip(ready, uids, reuse):
            self.uid_of[ins.rid] = uid
            self.rid_of[uid] = ins.rid
            self.order.append(ins.rid)
            self.reused[ins.rid] = n
            if ins.logprobs:
                self.wants_logprobs.add(ins.rid)
            if ins.prompt_logprobs >= 0:
                self.prompt_logprobs.ask(uid, ins.tokens, ins.prompt_logprobs)
            if ins.keep:
                self.keep.add(ins.rid)
            at = [ins.keep_at] if 0 < ins.keep_at < len(ins.tokens) else []
            self.boundaries.want(ins.rid, at + [len(ins.tokens) - 1] if ins.keep_prompt else at)
            if self._fail_seed is not None and ins.seed == self._fail_seed:
                self._seeded.add(ins.rid)

    def histories(self) -> dict[str, list[int]]:
        """Rank 0, before planning drafts: per decoding sequence, every token its cache holds and last its next
        input (what a proposer continues; engine/speculative)."""
        return {self.rid_of[uid]: h for uid, h in mlx_compat.decoding_histories(self.gen).items()
                if uid in self.rid_of}

    def step(self, drafts: dict[str, list[int]] | None = None, chain: bool = True) -> StepResults:
        """One batched forward step: (request id, token, finish reason) per token a decoding request gained.

        drafts (request id -> tokens proposed to follow its next input) are verified in the same forward pass
        (engine/speculative); without any, or when this model cannot drop rejected drafts, mlx-lm's own step.
        chain (the plan's, alike on every rank): SPECULATIVE=mtp's heads draft for the next plan after it."""
        out = StepResults()
        try:
            if self._seeded:
                raise RuntimeError("failpoint: a step holding a request with ENGINE_FAILPOINT's seed")
            rows = self._draft_rows(drafts) if drafts and self.verifies else None
            if rows is None:
                _, responses = self.gen.next()
            else:
                responses = mlx_compat.step_with_decoding(self.gen, lambda batch: self._verify(batch, rows, out))
            self.mtp_drafts = {}  # drafts of an older step are never handed out
            if self.chain_tokens and chain:
                self._chain()
        except Exception as exc:
            log.exception("the batched step raised")
            self.reset(_reason(exc))
            responses = []
        finished = set()
        for uid, rows in self.prompt_logprobs.take().items():
            if uid in self.rid_of:
                out.prompt_rows[self.rid_of[uid]] = rows
        for r in responses:
            rid = self.rid_of[r.uid]
            self.prompt_logprobs.forget((r.uid,))  # its prompt is done: decoding feeds no more of it
            if r.finish_reason is not None:
                finished.add(rid)
                self.uid_of.pop(rid, None)
                del self.rid_of[r.uid]
                if rid in self.keep and rid not in self.failed:
                    # until the next plan says whether to store it
                    self.ended[rid] = (r.prompt_cache, len(r.all_tokens))
            if rid in self.failed:
                continue  # its token came from a fallback; the request ends with an error instead
            out.tokens.append((rid, r.token, r.finish_reason))
            if rid in self.wants_logprobs:
                out.logprob_rows.setdefault(rid, []).append(r.logprobs)  # evaluated by mlx-lm; no copy
        if self.failed:
            self._drop_failed(finished)
        if finished:
            self.order = [rid for rid in self.order if rid not in finished]
            self.wants_logprobs -= finished
            self.keep -= finished
            for rid in finished:
                self.boundaries.forget(rid)
        if self.boundaries.wanted:
            self.boundaries.take(self.gen, self.uid_of)
        self.last_check = token_checksum([tok for _, tok, _ in out.tokens])
        out.failed = dict(self.failed)
        out.reused, self.reused = self.reused, {}
        self.failed.clear()  # in place: the guards of running requests hold this dict
        self.images.keep_only(set(self.order))
        return out

    def _chain(self) -> None:
        """Every rank holding the MTP heads (tensor parallel: every rank, their sharded layers meet; pipeline: rank 0,
        the last stage): their drafts for each decoding sequence's next input; rank 0's proposer hands them out
        with the next plan."""
        uids, nexts = mlx_compat.next_inputs(self.gen)
        if uids:
            cache = mlx_compat.Decoding(mlx_compat.decoding_batch(self.gen)).cache
            drafts = self.model.chain(cache, nexts, self.chain_tokens).tolist()
            self.mtp_drafts = {self.rid_of[uid]: [y, *d] for uid, y, d in zip(uids, nexts.tolist(), drafts)
                               if uid in self.rid_of}

    def _draft_rows(self, drafts: dict[str, list[int]]) -> list[list[int]] | None:
        """Drafts per row of the decoding batch (None: no decoding sequence has any)."""
        decoding = mlx_compat.Decoding(mlx_compat.decoding_batch(self.gen))
        rows = [_valid(drafts.get(self.rid_of.get(uid, ""), ()), self.vocab) for uid in decoding.uids]
        return rows if any(rows) else None

    def _verify(self, batch, rows: list[list[int]], out: StepResults) -> list:
        decoding = mlx_compat.Decoding(batch)
        uids = list(decoding.uids)
        verified = verify(decoding, rows, lambda i, exc: _failed(self.rid_of[uids[i]], exc, self.failed))
        out.proposed, out.accepted, out.positions = verified.proposed, verified.accepted, verified.positions
        out.drafted = {self.rid_of[uids[i]] for i in verified.drafted if uids[i] in self.rid_of}
        return verified.responses

    def _drop_failed(self, finished: set[str]) -> None:
        uids = [self.uid_of.pop(rid) for rid in self.failed if rid in self.uid_of]
        self.prompt_logprobs.forget(uids)
        if uids:
            try:
                self.gen.remove(uids)
            except Exception as exc:
                self.reset(_reason(exc))
                return
            for uid in uids:
                self.rid_of.pop(uid, None)
        finished.update(self.failed)
        self._seeded -= finished
