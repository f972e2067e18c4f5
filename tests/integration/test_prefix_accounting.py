"""What the prefix cache reports and bounds, on the real demo model: usage's cached tokens are what the batch
really reused, and its arrays (Metal buffers) stay within MAX_LIVE_BUFFERS. Rank 0's scheduler drives a real
LockstepBatch in one process, as the leader does (text handling faked: it is not under test)."""

from __future__ import annotations

import math

import pytest
from mlx_lm import load

from config import load_settings
from engine.lockstep.batch import LockstepBatch
from engine.lockstep.prefix import model_cuts
from engine.lockstep.plan import Insert
from engine.model import resolve
from engine.rank0.piece import Piece
from engine.rank0.prefix_index import PrefixIndex
from engine.rank0.requests import Counters, Request
from engine.rank0.scheduler import Scheduler
from ipc import Delta, Finish
from tests.harness import MODEL_CACHE


class _Text:
    """Detokenizer and splitter at once: no text, the choice ends only at its max_tokens or EOS."""

    last_segment = ""
    stop_sequence = None

    def add_token(self, token: int) -> None:
        pass

    def finalize(self) -> None:
        pass

    def feed(self, text: str) -> tuple[Piece, bool]:
        return Piece(), False

    def finish(self, reason: str) -> Piece:
        return Piece()


@pytest.fixture(scope="module")
def loaded():
    settings = load_settings({"MODEL": "demo-tiny", "MODEL_CACHE_DIR": str(MODEL_CACHE)}, env_file="/dev/null")
    model, tok = load(str(resolve(settings)))
    return model, set(tok.eos_token_ids)


@pytest.fixture
def engine(loaded):
    model, eos = loaded
    batch = LockstepBatch(model, eos, 64, 8)
    return Scheduler(8, eos, Counters(), lambda texts, asks: [], PrefixIndex(1 << 30, model_cuts(model))), batch


def _serve(sched: Scheduler, batch: LockstepBatch, tokens: list[int], drop: bool = False) -> tuple[int, list]:
    """Run one request to its end (and the plan storing its KV); (cache_len the lookup planned, its messages).
    drop: the ranks let go of the entry the lookup chose before the plan reaches them."""
    text = _Text()
    assert sched.counters.admit(1, capacity=8)
    sched.submit([Request(insert=Insert(rid=f"r{sched.step}", tokens=tokens, max_tokens=3), outbox=None,
                          prompt_tokens=len(tokens), deadline=math.inf, detok=text, splitter=text)])
    planned, messages = 0, []
    for _ in range(50):
        plan = sched.next_plan(batch.fingerprint(sched.step), batch.last_check, idle=not sched.has_work())
        for ins in plan.inserts:
            planned = ins.cache_len
            if drop and ins.cache_id:
                batch.prefix.evict([ins.cache_id])  # as a rank that evicted it, or found it damaged, would
        batch.apply(plan)
        if plan.stores or plan.evicts:  # as the leader does
            sched.prefix.applied(batch.prefix.sizes(), arrays=batch.prefix.arrays, batch_arrays=batch.batch_arrays())
        sched.step += 1
        if plan.idle:
            return planned, messages
        sched.absorb(batch.step())
        messages += [msg for _, msg in sched.take_events()]
    raise AssertionError("the request did not end within 50 steps")


def test_usage_counts_only_the_prompt_tokens_the_step_reused(engine):
    sched, batch = engine
    prompt = list(range(100, 140))
    _serve(sched, batch, prompt)
    # the ranks no longer hold the entry the lookup found: the whole prompt is computed, none of it was cached
    planned, messages = _serve(sched, batch, prompt + list(range(200, 210)), drop=True)
    assert planned >= len(prompt) - 1
    assert [m.cached_tokens for m in messages if isinstance(m, Delta | Finish)] == [0] * len(messages)
    assert sched.prefix.stats.cached_tokens == 0
    # the ranks hold it: the client is told what was reused, from its first message on
    planned, messages = _serve(sched, batch, prompt + list(range(200, 220)))
    assert planned >= len(prompt) + 10
    assert {m.cached_tokens for m in messages} == {planned}
    assert isinstance(messages[-1], Finish) and sched.prefix.stats.cached_tokens == planned


def test_many_short_entries_are_evicted_before_their_arrays_pass_max_live_buffers(engine):
    """Metal ends a process at ~499,000 live buffers: short entries reach that long before the byte budget."""
    sched, batch = engine
    _serve(sched, batch, list(range(100, 110)))
    per_entry = sum(batch.prefix.arrays.values())
    assert per_entry > 0
    sched.prefix.max_arrays = 3 * per_entry + per_entry // 2  # room for three entries, far below the byte budget
    for first in range(1, 10):  # conversations sharing nothing: each a short entry of its own
        _serve(sched, batch, [first] + list(range(100, 110)))
        assert batch.live_arrays() <= sched.prefix.max_arrays  # counted on the rank, not rank 0's view
        assert sched.prefix.live_arrays == batch.live_arrays()
    assert sched.prefix.stats.evictions >= 6 and len(batch.prefix.entries) == 3
    assert sched.prefix.nbytes < sched.prefix.budget // 1000
