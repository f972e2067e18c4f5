"""Verifying drafts in the decoding half of a batch: one forward pass over [next input, d1..dk] per sequence.

Each sequence walks its positions in order: position j's logits (after its next input and d1..dj) go through its
logits processors with exactly that context, then its sampler decides whether d(j+1) is the token there (greedy:
the argmax is the draft; sampled: SeededSampler.choose). The first position whose token is not the draft gives the
sequence its next input, to be fed by the following step (as mlx-lm samples one step ahead), and ends its walk:
processors never see a rejected draft, so a grammar's matcher only ever consumes tokens the sequence keeps, and a
draft its mask forbids has probability 0 and is never kept. The step returns the fed input and the kept drafts, in
order, each counted against max_tokens and stop sequences as mlx-lm counts a token; the first that ends the
sequence ends its tokens there. Each row of the cache then forgets the tokens it did not keep.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx

from engine.mlx_compat import Decoding
from engine.speculative import linear
from engine.speculative.rollback import drop_last, held


@dataclass
class Walk:
    """One sequence's outcome: the tokens now in its cache (its fed input, then the drafts it kept), the logprob
    row of each, and its next input with its row."""

    tokens: list[int]
    rows: list = field(default_factory=list)
    next_token: int = 0
    next_row: mx.array | None = None


@dataclass
class Verified:
    """The step's responses; the drafts it judged (a sequence's drafts after the token that ended it are not judged:
    nothing continues there) and kept; the rows that had any to judge."""

    responses: list
    proposed: int = 0
    accepted: int = 0
    drafted: list[int] = field(default_factory=list)
    positions: int = 0  # positions the forward pass computed: every row is as wide as the widest draft


def verify(dec: Decoding, drafts: list[list[int]], failed: Callable[[int, Exception], None]) -> Verified:
    """One speculative decoding step over every sequence of dec; drafts[i] follow sequence i's next input.
    failed(i, exc) is told of a sequence whose sampler raised: it then keeps only its fed input."""
    pending, pending_rows = dec.pending()
    room = _room(dec)
    # tokens past max_tokens are waste; past `room`, the widest row would write where no budget reserved KV
    drafts = [d[:max(0, min(dec.remaining(i) - 1, room))] for i, d in enumerate(drafts)]
    width = 1 + max(map(len, drafts))
    fed = mx.array([[t, *d] + [t] * (width - 1 - len(d)) for t, d in zip(pending, drafts)], dtype=mx.uint32)
    with linear.recording(dec.model, dec.cache) as recorded:
        logits = dec.model(fed, cache=dec.cache)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    walks = []
    for i, d in enumerate(drafts):
        walk = Walk([pending[i]], [pending_rows[i]])
        try:
            _walk(dec, i, logits[i], logprobs[i], d, walk)
        except Exception as exc:  # this sequence's sampling: it fails alone, the batch keeps its shape
            failed(i, exc)
            walk = Walk([pending[i]], [pending_rows[i]], mx.argmax(logprobs[i, 0]).item(), logprobs[i, 0])
        walks.append(walk)
    return _finish(dec, walks, drafts, width, fed[:, 0], recorded)


def _room(dec: Decoding) -> int:
    """Drafts a row may have this step: every row is as wide as the widest, and the batch's KV must stay within the
    positions its longest sequence reserves (prompt + max_tokens, which the KV budget and the context limit cap),
    also for a row near its end that gets no drafts."""
    reserved = max(len(dec.fed(i)) + dec.remaining(i) for i in range(len(dec)))  # prompt + max_tokens, per row
    return reserved - held(dec.cache) - 1  # the next input takes one position


def _walk(dec: Decoding, i: int, logits: mx.array, logprobs: mx.array, drafts: list[int], walk: Walk) -> None:
    """Fill walk with the drafts sequence i keeps and its next input."""
    sampler, processors = dec.sampler(i), dec.processors(i)
    if sampler is None and not processors:  # the common greedy case: every position's choice in one evaluation
        choices = mx.argmax(logprobs, axis=-1).tolist()
        kept = 0
        while kept < len(drafts) and choices[kept] == drafts[kept]:
            kept += 1
        walk.tokens += drafts[:kept]
        walk.rows += [logprobs[j] for j in range(kept)]
        walk.next_token, walk.next_row = choices[kept], logprobs[kept]
        return
    choose = _greedy if sampler is None else getattr(sampler, "fn", sampler).choose
    context = dec.context(i)
    tokens = context.update_and_fetch(mx.array(walk.tokens[:1])) if processors else None
    for j in range(len(drafts) + 1):
        row = logits[j:j + 1]
        for processor in processors:
            row = processor(tokens, row)
        row = row - mx.logsumexp(row, axis=-1, keepdims=True)
        draft = drafts[j] if j < len(drafts) else None
        token, kept = choose(row, draft)
        if not kept:
            walk.next_token, walk.next_row = token, row[0]
            return
        walk.tokens.append(token)
        walk.rows.append(row[0])
        if processors:
            tokens = context.update_and_fetch(mx.array([token]))


def _greedy(logprobs: mx.array, draft: int | None) -> tuple[int, bool]:
    token = mx.argmax(logprobs, axis=-1).item()
    return token, token == draft


def _finish(dec: Decoding, walks: list[Walk], drafts: list[list[int]], width: int, fed: mx.array,
            recorded: linear.Recording | None) -> Verified:
    """Count the tokens each sequence returns, roll back what it does not keep, and answer as mlx-lm's step."""
    out = Verified([], drafted=[i for i, d in enumerate(drafts) if d], positions=len(drafts) * width)
    mx.eval([w.rows for w in walks], [w.next_row for w in walks])
    ends: list[str | None] = []
    for i, walk in enumerate(walks):
        reason, judged = None, len(drafts[i])
        for n, token in enumerate(walk.tokens):
            reason = dec.count(i, token)
            if reason is not None:
                if n + 1 < len(walk.tokens):  # ended inside its accepted drafts: those after n were never judged
                    judged = n
                del walk.tokens[n + 1:], walk.rows[n + 1:]
                break
        out.proposed += judged
        out.accepted += len(walk.tokens) - 1
        dec.fed(i).extend(walk.tokens)
        ends.append(reason)
    drop_last(dec.cache, [width - len(w.tokens) for w in walks], recorded)
    if hasattr(dec.model, "kept"):  # SPECULATIVE=mtp: the hidden each row carries is at its last kept token
        dec.model.kept(dec.cache, [len(w.tokens) - 1 for w in walks])
    keep = []
    for i, (walk, reason) in enumerate(zip(walks, ends)):
        last = len(walk.tokens) - 1
        out.responses += [dec.response(i, t, r, reason if n == last else None)
                          for n, (t, r) in enumerate(zip(walk.tokens, walk.rows))]
        if reason is None:
            keep.append(i)
    dec.set_pending(fed, [w.next_token for w in walks], [w.next_row for w in walks])
    dec.filter(keep)
    return out
