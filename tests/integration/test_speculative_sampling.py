"""Speculative sampling keeps the target distribution: on a model whose next-token distribution is known exactly
(a Markov chain over four tokens), sampled output with arbitrary drafts has the distribution of plain sampling."""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from engine.lockstep.batch import LockstepBatch
from engine.lockstep.plan import Insert, Plan
from engine.speculative.mtp import MtpProposer
from engine.speculative.mtp_model import MtpModel

V = 4
TABLE = np.log(np.array([[0.50, 0.25, 0.15, 0.10],
                         [0.12, 0.58, 0.20, 0.10],
                         [0.30, 0.32, 0.28, 0.10],
                         [0.05, 0.15, 0.45, 0.35]]))
TEMPERATURE, TOP_K = 0.8, 3
PROMPT = [0, 3]
SAMPLES = 4096
BATCH = 128


class Markov:
    """Logits that depend only on the token at each position; it writes a (dummy) cache like a real model, so the
    batch's padding and rollback run as for one."""

    layers = [None]

    def make_cache(self):
        return [KVCache()]

    def __call__(self, inputs, cache=None, **_):
        if cache:
            dummy = mx.zeros((inputs.shape[0], 1, inputs.shape[1], 1))
            cache[0].update_and_fetch(dummy, dummy)
        return mx.array(TABLE, dtype=mx.float32)[inputs]


def target(a: int) -> np.ndarray:
    """The next-token distribution the request samples from after token a: top-k filtered, tempered."""
    logits = TABLE[a].copy()
    logits[np.argsort(logits)[:V - TOP_K]] = -np.inf
    p = np.exp(logits / TEMPERATURE)
    return p / p.sum()


class MarkovHeads:
    """MTP heads for the Markov chain: from the token fed they draft its likeliest successor, writing a dummy cache
    entry per position as a real MTP layer writes its KV."""

    def make_cache(self):
        return [KVCache()]

    def __call__(self, hidden, tokens, cache, depth=0):
        dummy = mx.zeros((tokens.shape[0], 1, tokens.shape[1], 1))
        cache[0].update_and_fetch(dummy, dummy)
        x = mx.eye(V)[tokens] + 0 * hidden
        return x, mx.array(TABLE, dtype=mx.float32)[tokens]


class MarkovMain(Markov):
    """Markov as an mlx-lm model with a hidden state (the one-hot token) and an lm_head, for MtpModel to wrap."""

    def __init__(self):
        self.model = self.hidden

    def hidden(self, inputs, cache=None):
        Markov.__call__(self, inputs, cache)
        return mx.eye(V)[inputs]

    def lm_head(self, h):
        return h @ mx.array(TABLE, dtype=mx.float32)


def mtp(lockstep: LockstepBatch):
    """The drafter of SPECULATIVE=mtp: rank 0's proposer handing out what the batch's heads chained."""
    proposer = MtpProposer.__new__(MtpProposer)
    proposer.read_from(lockstep)

    def drafts(got):
        proposed = proposer.propose(lockstep.histories(), 2)
        MTP_DRAFTS.extend(proposed.values())
        return proposed
    return drafts


MTP_DRAFTS: list[list[int]] = []  # what the mtp drafter proposed


def outputs(drafter, seeds, batch: int = BATCH) -> dict[int, tuple[int, ...]]:
    """Each seed's sampled tokens, its request run in batches of `batch` with the drafts drafter proposes (mtp: the
    Markov chain with MTP heads drafting its likeliest tokens)."""
    out: dict[int, tuple[int, ...]] = {}
    for start in range(0, len(seeds), batch):
        if drafter is mtp:
            lockstep = LockstepBatch(MtpModel(MarkovMain(), MarkovHeads()), set(), 64, batch)
            lockstep.chain_tokens = 2
            drafter_now = mtp(lockstep)
        else:
            lockstep, drafter_now = LockstepBatch(Markov(), set(), 64, batch), drafter
        inserts = [Insert(rid=str(s), tokens=PROMPT, max_tokens=3, temperature=TEMPERATURE, top_k=TOP_K, seed=s)
                   for s in seeds[start:start + batch]]
        lockstep.apply(Plan(step=0, fingerprint=0, token_check=0, inserts=inserts))
        got: dict[str, list[int]] = {ins.rid: [] for ins in inserts}
        while len(lockstep):
            res = lockstep.step(drafter_now(got) if drafter_now else None)
            assert not res.failed
            for rid, token, _ in res.tokens:
                got[rid].append(token)
        out |= {int(rid): tuple(tokens) for rid, tokens in got.items()}
    return out


def sample(drafter, seeds) -> dict[tuple[int, ...], int]:
    counts: dict[tuple[int, ...], int] = {}
    for tokens in outputs(drafter, seeds).values():
        counts[tokens] = counts.get(tokens, 0) + 1
    return counts


def total_variation(counts: dict[tuple[int, ...], int]) -> float:
    n = sum(counts.values())
    tv = 0.0
    for y in itertools.product(range(V), repeat=3):
        exact = target(PROMPT[-1])[y[0]] * target(y[0])[y[1]] * target(y[1])[y[2]]
        tv += abs(counts.get(y, 0) / n - exact)
    return tv / 2


def arbitrary(out: dict[str, list[int]]) -> dict[str, list[int]]:
    """Drafts that depend on the history only: often likely tokens, sometimes ones top-k drops."""
    drafts = {}
    for rid, got in out.items():
        kind = int(rid) % 3
        last = got[-1] if got else 0
        drafts[rid] = [[2, 2], [1, 2], [(last + int(rid) + j) % V for j in range(2)]][kind]
    return drafts


def test_sampled_output_with_arbitrary_drafts_keeps_the_target_distribution():
    seeds = list(range(SAMPLES))
    plain, spec = total_variation(sample(None, seeds)), total_variation(sample(arbitrary, seeds))
    # 64 outcomes, 4096 samples: the sampling error's total variation is about 0.03 (seeds fixed: no flake); drawing
    # a rejection's token from p with the draft left in gives 0.10, always keeping the draft 0.89
    print(f"\ntotal variation from the target: plain {plain:.4f}, with drafts {spec:.4f}")
    assert plain < 0.06, plain
    assert spec < 0.06, spec


def likely(out: dict[str, list[int]]) -> dict[str, list[int]]:
    """Drafts of the likeliest continuation, for some rows only: what a batch's proposer gives depends on the batch."""
    return {rid: [1, 1] if got and got[-1] == 1 else [2, 3] for rid, got in out.items() if len(out) % 2 or got}


def test_a_seed_gives_plain_decodings_tokens_whatever_the_drafts_and_the_batch():
    seeds = list(range(24))
    alone = outputs(None, seeds, batch=1)  # plain decoding, one request at a time
    assert outputs(arbitrary, seeds) == alone
    assert outputs(likely, seeds, batch=5) == alone
    # the MTP heads' drafts (a model wrapped with heads: its carry and chain run in every step) change nothing either
    MTP_DRAFTS.clear()
    assert outputs(mtp, seeds, batch=5) == alone
    assert sum(map(len, MTP_DRAFTS)) > 0
