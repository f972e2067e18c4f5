"""Rank 0's decisions: admission, step plans, and turning sampled tokens into client events.

No MLX here: what needs it (the logprob extraction, each choice's detokenizer and splitter) is
passed in, so unit tests drive the scheduler with fakes.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

import msgspec

from engine.lockstep.plan import GRAMMAR_CACHE_SIZE, Insert, Plan, Store
from engine.lockstep.results import StepResults
from engine.rank0 import errors
from engine.rank0.disk_plan import DiskPlanner
from engine.rank0.kv_budget import KVBudget, batch_bytes
from engine.rank0.piece import Piece
from engine.rank0.prompt_logprobs import ENTRIES_PER_EVENT, entries, first_entry
from engine.rank0.prefix_index import PARTIAL_MIN_TOKENS, SHARE_MIN_TOKENS, PrefixIndex, common_prefix, token_bytes
from engine.rank0.requests import Counters, Request, append_logprobs
from engine.vision.ids import needed
from ipc import Delta, Error, Finish
from ipc.messages import TokenLogprob

log = logging.getLogger(__name__)

# the reason a step gives for a choice whose grammar failed mid-output (engine/decoding/constrained.py)
GRAMMAR_FAILED = "GrammarFailed"

# Where conversations part is kept as an entry only this many tokens past what the prompt reuses: on a model whose
# entries cannot be cut, each entry holds a whole state (a linear-attention layer's is constant, and large on real
# models), worth it for a system prompt and tools, not for a chat template's header.
PARTING_MIN_TOKENS = 64

# (sampled token, its logprob row, how many alternatives) per asking choice -> one TokenLogprob each;
# the first argument is the choices' token texts (engine/rank0/logprobs.py: extract).
ExtractLogprobs = Callable[[Any, list[tuple[int, Any, int]]], list[TokenLogprob]]


class Scheduler:
    """Builds each step's plan and converts its results into Delta/Finish/Error events.

    With a KV budget, a waiting request joins the batch only when the batch's KV with it, plus the prefix
    cache, fits; the prefix cache yields first (least recently used entries), then the request waits at
    the head of the queue, and everything behind it waits too (strict FIFO: a long request is never
    starved by shorter ones that keep fitting), until running sequences finish.
    """

    def __init__(self, max_batch: int, eos_token_ids: set[int], counters: Counters, extract: ExtractLogprobs,
                 prefix: PrefixIndex | None = None, kv: KVBudget | None = None, disk: DiskPlanner | None = None):
        self.max_batch = max_batch
        self.prefix = prefix if prefix is not None else PrefixIndex(0)
        self.disk = disk if disk is not None else DiskPlanner(self.prefix)  # the disk tier (off until opened)
        self.kv = kv if kv is not None else KVBudget(0, 0)
        self.kv_reserved = 0  # KV bytes per rank the running sequences may take (read by the socket thread)
        self.stores: list[Store] = []  # sequences that ended, whose KV the next plan keeps
        # sequences being prefilled that a waiting prompt shares a long prefix with: their prompt's KV is kept as
        # an entry as soon as its prefill is done, and the waiting prompt starts from it
        self.wanted: set[str] = set()
        self.eos = eos_token_ids
        self.counters = counters
        self.extract = extract
        self.waiting: deque[Request] = deque()
        self.running: dict[str, Request] = {}
        self.to_remove: list[str] = []
        self.step = 0
        self.events: list[tuple[Any, Any]] = []
        # The grammars every rank has compiled, in the ranks' own LRU order (they insert what we plan).
        self.grammars: OrderedDict[str, None] = OrderedDict()

    def submit(self, requests: list[Request]) -> None:
        """Queue every choice of one request, unless one of its ids still names a sequence in the engine
        (a client reusing the id of a request it just abandoned, before the batch has let that go)."""
        busy = {*self.running, *self.to_remove, *(r.rid for r in self.waiting)}
        if any(req.rid in busy for req in requests):
            self._left_queue(len(requests))
            first = requests[0]
            error = errors.invalid_request(f"request_id {first.group or first.rid!r} still names a request the "
                                           "engine is ending; use a unique id for every request", "request_id",
                                           "request_id_in_use", first.group or first.rid)
            self._close(first, error)
            for req in requests[1:]:
                req.done = True
            return
        self.waiting.extend(requests)

    def cancel(self, rid: str, reason: Error | None = None) -> None:
        """Drop a request (every choice of it) wherever it is; its client gets `reason` if one is given."""
        queued = [r for r in self.waiting if rid in (r.rid, r.group)]
        for req in queued:
            self.waiting.remove(req)
            self._close(req, reason)
        if queued:
            self._left_queue(len(queued))
        for req in [r for r in self.running.values() if rid in (r.rid, r.group)]:
            if not req.done:
                self._close(req, reason)
                self.to_remove.append(req.rid)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.to_remove or self.stores or self.prefix.evicting
                    or self.disk.has_work())

    def expire(self, now: float) -> None:
        """Requests past REQUEST_TIMEOUT end with an error, in any phase."""
        for req in [r for r in (*self.waiting, *self.running.values()) if r.deadline < now and not r.done]:
            self.cancel(req.rid, errors.timed_out(req.group or req.rid))

    def next_plan(self, fingerprint: int, token_check: int, *, idle: bool = False, shutdown: bool = False) -> Plan:
        # The batch applies removes before inserts: their slots are free for this plan's inserts.
        self.wanted &= self.running.keys()
        removes, self.to_remove = self.to_remove, []
        for rid in removes:
            req = self.running.pop(rid, None)
            if req is not None:
                self._keep(req)  # a removed sequence's KV is as good as a finished one's
        inserts = []
        new_grammar = False
        while self.waiting and len(self.running) < self.max_batch and not shutdown:
            grammar = self.waiting[0].insert.grammar
            fresh = bool(grammar) and grammar not in self.grammars
            if fresh and new_grammar:
                break  # every rank compiles it inside the step: one new grammar per step
            if not self._kv_fits(self.waiting[0]):
                break  # it waits for running sequences to end, and everything behind it with it
            if self.prefix.enabled and self._shares_a_prefill(self.waiting[0]):
                break  # it waits for that prefill (a few steps), everything behind it with it
            new_grammar = new_grammar or fresh
            if grammar:
                self.grammars[grammar] = None
                self.grammars.move_to_end(grammar)
                if len(self.grammars) > GRAMMAR_CACHE_SIZE:
                    self.grammars.popitem(last=False)
            req = self.waiting.popleft()
            self.running[req.rid] = req
            if self.prefix.enabled:
                # a prompt whose logprobs are asked is computed whole (an entry holds KV, not logits); its KV is
                # still kept for the prompts after it
                entry, reuse = self.prefix.lookup(req.insert.tokens, req.tenant) if not req.scores else (0, 0)
                if not req.scores:  # a disk entry giving more is restored (every rank loads it before the insert)
                    entry, reuse = self.disk.lookup(req.insert.tokens, req.tenant, entry, reuse)
                req.cached_tokens = reuse  # what the lookup promises; the step's results say what was reused
                # where its entry could not be cut back to the prompt, the prompt's end is kept apart: a next turn
                # extends the prompt, not the answer as it was sampled
                whole = not self.prefix.cuts.can_cut(len(req.insert.tokens) + req.insert.max_tokens)
                parting = self._parting(req, reuse) if whole else 0
                # an image wholly inside the reused prefix is not embedded again, so its features stay on rank 0,
                # where the ranks confirmed holding the entry (its bytes known): one stored by this plan may be dropped
                held = self.prefix.entries.get(entry)
                images = req.insert.images
                if reuse and images and held is not None and held.nbytes:
                    images = needed(images, req.insert.tokens, reuse)
                req.insert = msgspec.structs.replace(req.insert, cache_id=entry, cache_len=reuse, keep=True,
                                                     keep_prompt=whole, keep_at=parting, images=images)
            else:
                self.prefix.count(req.insert.tokens)
            inserts.append(req.insert)
        # One update, so the socket thread never sees a sequence in neither count (or both).
        with self.counters.lock:
            self.counters.waiting -= len(inserts)
            self.counters.active = len(self.running)
        self.kv_reserved = self._reserved()
        stores, self.stores = self.stores, []
        evicts = self.prefix.take_evictions()
        stores, restores, deletes = self.disk.take(stores)
        busy = inserts or removes or stores or evicts or restores or deletes
        return Plan(step=self.step, fingerprint=fingerprint, token_check=token_check,
                    inserts=inserts, removes=removes, stores=stores, evicts=evicts, restores=restores,
                    disk_deletes=deletes, idle=idle and not busy, shutdown=shutdown)

    def kv_bytes(self, req: Request) -> int:
        """The most KV req's sequence can take on a rank."""
        return self.kv.sequence(len(req.insert.tokens), req.insert.max_tokens)

    def _reserved(self, joining: Request | None = None) -> int:
        """The running sequences' KV (with joining's, when given), as the padded batch holds it."""
        sizes = [self.kv_bytes(r) for r in self.running.values()]
        if joining is not None:
            sizes.append(self.kv_bytes(joining))
        return batch_bytes(sizes)

    def _kv_fits(self, req: Request) -> bool:
        """Whether req's KV fits the budget next to the running sequences' and the prefix cache; the prefix
        cache gives up its least recently used entries to make room before req has to wait."""
        if not self.kv.enabled:
            return True
        room = self.kv.budget - self._reserved(req)
        if room < 0:
            return False
        # entries whose store no plan has applied yet are not measured: count them at their estimate
        pending = sum(self.kv.sequence(e.length, 0) for e in self.prefix.entries.values() if not e.nbytes)
        pending += sum(self.kv.sequence(len(p.tokens), 0) for p in self.prefix.partial.values())
        if self.prefix.nbytes > room - pending:
            self.prefix.fit(max(0, room - pending))
        return self.prefix.nbytes + pending <= room

    def _shares_a_prefill(self, req: Request) -> bool:
        """Whether req shares a long prefix with a prompt still being prefilled, beyond what the cache holds:
        then that prompt's KV is kept when its prefill ends, and req waits to start from it. Concurrent
        requests with one system prompt compute it once."""
        if req.scores:
            return False  # it reuses nothing
        limit = len(req.insert.tokens) - 1
        _, cached = self.prefix.best(req.key, limit, req.tenant)
        for p in self.prefix.partial.values():
            # a prefill this plan removes (its client gone): kept as an entry once applied, which a retry of it starts
            # from (its length is known then: the wait is one plan)
            common = min(common_prefix(token_bytes(p.tokens), req.key), limit)
            if p.tenant == req.tenant and common >= p.least and common - cached >= SHARE_MIN_TOKENS:
                return True
        for other in self.running.values():
            if other.insert.keep and not other.sampled and not other.done and other.tenant == req.tenant:
                # what its prompt's entry could give req (of a model whose entries cannot be cut: all or nothing)
                common = min(common_prefix(other.key, req.key), limit)
                kept = len(other.insert.tokens) - 1 if other.insert.keep_prompt else len(other.insert.tokens)
                shared = self.prefix.cuts.reusable(kept, common)
                if other.insert.keep_at and common >= other.insert.keep_at:
                    shared = max(shared, other.insert.keep_at)  # where it parts from others, kept as an entry
                if shared - cached >= SHARE_MIN_TOKENS:
                    self.wanted.add(other.rid)
                    return True
        return False

    def _parting(self, req: Request, reused: int) -> int:
        """Where req's prompt parts from another conversation's (an entry's prompt, a prompt waiting or running) past
        what it reuses: the end of a system prompt and tools they share, kept as an entry of its own on a model
        whose entries cannot be cut (0: nowhere worth it). A turn that holds another's whole prompt continues it."""
        limit = len(req.insert.tokens) - 1
        best = 0
        for tokens, prompt, tenant in (*((e.tokens, e.prompt, e.tenant) for e in self.prefix.entries.values()),
                                       *((o.key, len(o.insert.tokens), o.tenant)
                                         for o in (*self.waiting, *self.running.values()) if o is not req)):
            if tenant == req.tenant:
                n = common_prefix(tokens, req.key)
                if n < prompt:
                    best = max(best, min(n, limit))
        return best if best >= reused + PARTING_MIN_TOKENS else 0

    def _prompt_done(self, req: Request) -> None:
        """A prompt has been prefilled (its first token came back) that others wait for, or whose end the batch kept
        (Insert.keep_prompt): keep its KV as an entry (the next plan stores it), and where it parts from others."""
        self.wanted.discard(req.rid)
        ins = req.insert
        if ins.keep_at:
            entry = self.prefix.add(ins.tokens[:ins.keep_at], tenant=req.tenant, shared=True)
            if entry is not None:
                self._store(req, entry, ins.tokens[:ins.keep_at], ins.keep_at)
        # kept as the state before the prompt's last token (Insert.keep_prompt): a next turn extends it, and the
        # very same prompt again (a regenerated answer, a retry) computes only that last token
        tokens = ins.tokens[:-1] if ins.keep_prompt else ins.tokens
        source = (ins.cache_id, ins.cache_len) if ins.keep_prompt else (0, 0)  # a turn moving on from its last
        entry = self.prefix.add(tokens, *source, tenant=req.tenant)
        if entry is not None:
            self._store(req, entry, tokens, len(tokens))

    def _keep(self, req: Request) -> None:
        """Plan to store the KV of a sequence that ends, as a prefix cache entry: the prompt and all but the last
        sampled token where the entry can be cut to that, else every token it fed (the last sampled included)."""
        if not req.insert.keep:
            return
        if not req.sampled:
            self._keep_fed(req)
            return
        fed = req.insert.tokens + req.sampled
        tokens = fed[:-1] if self.prefix.cuts.can_cut(len(fed)) else fed
        # a sequence that kept its prompt's end moved on from the entry it started from there (_prompt_done)
        source = (0, 0) if req.insert.keep_prompt else (req.insert.cache_id, req.insert.cache_len)
        entry = self.prefix.add(tokens, *source, len(req.insert.tokens), req.tenant)
        if entry is not None:
            self._store(req, entry, tokens, len(req.insert.tokens))

    def _store(self, req: Request, entry: int, tokens: list[int], prompt: int) -> None:
        """Plan to keep `tokens` of req's sequence as entry, in RAM and written through to the disk tier."""
        name = self.disk.name(entry, tokens, req.tenant, min(prompt, len(tokens)))
        self.stores.append(Store(rid=req.rid, entry=entry, length=len(tokens), disk=name))

    def _keep_fed(self, req: Request) -> None:
        """Plan to store what a sequence removed mid-prefill (its client gone, timed out) has fed of its prompt, so
        that a retry computes only the rest: every rank keeps the same tokens, so an entry of exactly them is valid for
        every cache kind (a linear-attention or sliding-window state included), and rank 0 learns how many once the
        plan is applied (PrefixIndex.reserve)."""
        ins = req.insert
        most = len(ins.tokens) - 1  # a prefill never feeds the prompt's last token: it starts the generation
        least = ins.cache_len + PARTIAL_MIN_TOKENS
        if least > most:
            return
        source = (0, 0) if ins.keep_prompt else (ins.cache_id, ins.cache_len)
        entry = self.prefix.reserve(ins.tokens[:most], least, *source, tenant=req.tenant)
        self.stores.append(Store(rid=req.rid, entry=entry, length=most, least=least))

    def absorb(self, results: StepResults) -> None:
        """Turn one step's sampled tokens into client events."""
        self._joined(results)
        for rid, reason in results.failed.items():
            self._fail(self.running.pop(rid, None), reason)  # every rank has already dropped it
        append_logprobs(self.running, self.eos, self.extract, results)
        self._prompt_logprobs(results)
        for rid, token, finish in results.tokens:
            req = self.running.get(rid)
            if req is None:
                continue
            req.sampled.append(token)
            if len(req.sampled) == 1 and not req.done:
                self._echo(req)
            if len(req.sampled) == 1 and (req.insert.keep_prompt or (finish is None and req.rid in self.wanted)):
                self._prompt_done(req)
            if finish is not None:
                self.running.pop(rid)  # the batch already dropped it on every rank
                self._keep(req)
            if req.done:
                continue
            if req.score_only:  # max_tokens 0: the token sampled after the prompt is no part of the answer
                req.logprobs = []
                self._close(req, None, "length")
                if finish is None:
                    self.to_remove.append(rid)
                continue
            try:
                self._output(req, token, finish)
            except Exception as exc:  # rank 0's own work for one request: only that request ends
                log.exception("request %s: turning its tokens into output failed", rid)
                if finish is None:
                    self.to_remove.append(rid)
                self._fail(req, f"{type(exc).__name__} while decoding its output")
        self._count()

    def _joined(self, results: StepResults) -> None:
        """The sequences the step inserted: each client learns the prompt tokens really reused, before any token
        (a stream reports them at its start). The ranks may have dropped an entry since the lookup (evicted,
        refused): the prompt was then computed in full, and neither usage nor the stats may say it was cached."""
        for rid, reused in results.reused.items():
            req = self.running.get(rid)
            if req is None or req.done or rid in results.failed:
                continue
            if reused != req.cached_tokens:
                self.prefix.unhit(req.cached_tokens, reused)
                req.cached_tokens = reused
            # an echo with logprobs waits for them (_echo)
            self._send(req, Piece(content="" if req.scores else req.echo))

    def _output(self, req: Request, token: int, finish: str | None) -> None:
        req.completion_tokens += 1
        if not (finish == "stop" and token in self.eos):
            req.detok.add_token(token)
        if finish is not None:
            req.detok.finalize()
        piece, ended = req.splitter.feed(req.detok.last_segment)
        if ended or finish is not None:
            if not ended:
                piece.add(req.splitter.finish(finish))
            # A stop string or a lone tool call ends the choice early: the batch lets it go.
            self._close(req, None, "stop" if ended else finish, piece, req.splitter.stop_sequence if ended else None)
            if ended and finish is None:
                self.to_remove.append(req.rid)
        elif piece or req.logprobs:
            self._send(req, piece)

    def _fail(self, req: Request | None, reason: str) -> None:
        """A choice could not be generated: its request (every choice of it) ends with an error, others go on."""
        if req is None or req.done:
            return
        self.running.pop(req.rid, None)
        rid = req.group or req.rid
        if reason.startswith(GRAMMAR_FAILED):  # the client's schema gave out, not the engine: a 400
            error = errors.invalid_request(reason.removeprefix(GRAMMAR_FAILED).lstrip(": "), None,
                                           "schema_too_complex", rid)
        else:
            error = errors.generation_failed(
                rid, f"generation failed on the engine ({reason}); the request was ended and the "
                     "engine keeps serving; retry, and report it if it happens again")
        self._close(req, error)
        if req.group:
            self.cancel(req.group, error)  # its other choices stop too: nobody reads them any more

    def _prompt_logprobs(self, results: StepResults) -> None:
        """Keep the prompt logprobs this step's prefill computed for the requests that asked."""
        for rid, rows in results.prompt_rows.items():
            req = self.running.get(rid)
            if req is not None and not req.done and req.texts is not None:
                if not req.prompt_logprobs:
                    req.prompt_logprobs.append(first_entry(req.texts, req.insert.tokens[0]))
                req.prompt_logprobs.extend(entries(req.texts, req.insert.tokens, rows))

    def _echo(self, req: Request) -> None:
        """Its prompt is done (its first token came): an echo with logprobs goes out now, with them."""
        if not req.scores:
            return
        scored, req.prompt_logprobs = req.prompt_logprobs, []
        if not scored:  # a one-token prompt: no prefill pass, only its first token
            scored = [first_entry(req.texts, req.insert.tokens[0])]
        held, req.logprobs = req.logprobs, []
        for i in range(0, len(scored), ENTRIES_PER_EVENT):
            req.logprobs = scored[i:i + ENTRIES_PER_EVENT]
            self._send(req, Piece(content=req.echo if i == 0 else ""))
        req.logprobs = held

    def _send(self, req: Request, piece: Piece) -> None:
        logprobs, req.logprobs = req.logprobs, []
        self.events.append((req.outbox, Delta(
            request_id=req.group or req.rid, text=piece.content, completion_tokens=req.completion_tokens,
            index=req.index, reasoning=piece.reasoning, tool_calls=piece.tool_calls, logprobs=logprobs,
            cached_tokens=req.cached_tokens)))

    def _close(self, req: Request, error: Error | None, finish: str | None = None, piece: Piece | None = None,
               stop_sequence: str | None = None) -> None:
        req.done = True
        if error is not None:
            self.events.append((req.outbox, error))
        elif finish is not None:
            piece = piece or Piece()
            logprobs, req.logprobs = req.logprobs, []
            self.events.append((req.outbox, Finish(
                request_id=req.group or req.rid, finish_reason=finish, prompt_tokens=req.prompt_tokens,
                completion_tokens=req.completion_tokens, cached_tokens=req.cached_tokens, text=piece.content,
                index=req.index, reasoning=piece.reasoning, tool_calls=piece.tool_calls, logprobs=logprobs,
                stop_sequence=stop_sequence)))

    def take_events(self) -> list[tuple[Any, Any]]:
        events, self.events = self.events, []
        return events

    def _left_queue(self, n: int) -> None:
        # The socket thread adds to `waiting` on admission; requests leave it here.
        with self.counters.lock:
            self.counters.waiting -= n

    def _count(self) -> None:
        self.counters.active = len(self.running)
        self.kv_reserved = self._reserved()
