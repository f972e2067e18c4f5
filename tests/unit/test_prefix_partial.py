"""A prompt cancelled mid-prefill leaves the tokens it fed in the prefix cache, and its retry starts from them.

Rank 0's scheduler and prefix index without MLX; the ranks are played by Store.keeps, the rule every rank's batch
applies (engine/lockstep/batch.py), over the tokens each sequence had fed.
"""

from __future__ import annotations

import math

from engine.lockstep.plan import Insert, Store
from engine.lockstep.results import StepResults
from engine.rank0.prefix_index import PARTIAL_MIN_TOKENS, PrefixIndex
from engine.rank0.requests import Counters, Request
from engine.rank0.scheduler import Scheduler
from tests.unit.test_scheduler import EOS, Detok, TextSplitter, extract

PROMPT = list(range(100, 5100))  # a long agent prompt


def make(budget: int = 10**9) -> Scheduler:
    return Scheduler(8, {EOS}, Counters(), extract, PrefixIndex(budget))


def submit(sched: Scheduler, rid: str, tokens: list[int], tenant: str = "") -> None:
    assert sched.counters.admit(1, capacity=100)
    sched.submit([Request(insert=Insert(rid=rid, tokens=tokens, max_tokens=8), outbox=[], prompt_tokens=len(tokens),
                          deadline=math.inf, detok=Detok(), splitter=TextSplitter(), group=rid, tenant=tenant)])


def applied(sched: Scheduler, plan, fed: dict[str, int]) -> None:
    """Every rank applied plan, each removed sequence having fed fed[rid] tokens (a byte of KV per token)."""
    kept = {st.entry: st.keeps(fed.get(st.rid, st.length)) for st in plan.stores}
    lengths = {**{i: e.length for i, e in sched.prefix.entries.items()}, **{i: n for i, n in kept.items() if n}}
    sched.prefix.applied(dict(lengths), lengths=lengths)


def cancel_mid_prefill(sched: Scheduler, rid: str, fed: int, tenant: str = ""):
    submit(sched, rid, PROMPT, tenant)
    applied(sched, sched.next_plan(0, 0), {})
    sched.absorb(StepResults())  # prefill steps: no token yet
    sched.cancel(rid)
    plan = sched.next_plan(0, 0)
    applied(sched, plan, {rid: fed})
    return plan


def test_a_prompt_cancelled_mid_prefill_is_kept_as_far_as_it_was_fed_and_its_retry_starts_there():
    sched = make()
    plan = cancel_mid_prefill(sched, "a", fed=3000)
    assert plan.removes == ["a"]
    assert plan.stores == [Store(rid="a", entry=1, length=len(PROMPT) - 1, least=PARTIAL_MIN_TOKENS)]
    (entry,) = sched.prefix.entries.values()
    assert entry.length == 3000 and not sched.prefix.partial
    submit(sched, "a-retry", PROMPT)
    (retry,) = sched.next_plan(0, 0).inserts
    assert (retry.cache_id, retry.cache_len) == (1, 3000)


def test_a_retry_arriving_with_the_cancel_waits_one_plan_for_the_entry():
    sched = make()
    submit(sched, "a", PROMPT)
    applied(sched, sched.next_plan(0, 0), {})
    sched.cancel("a")
    submit(sched, "a-retry", PROMPT)  # the client's retry reaches the engine before the next plan
    plan = sched.next_plan(0, 0)
    assert plan.removes == ["a"] and not plan.inserts
    applied(sched, plan, {"a": 1024})
    (retry,) = sched.next_plan(0, 0).inserts
    assert retry.cache_len == 1024


def test_too_little_fed_keeps_nothing():
    sched = make()
    cancel_mid_prefill(sched, "a", fed=PARTIAL_MIN_TOKENS - 1)
    assert not sched.prefix.entries and not sched.prefix.partial
    submit(sched, "short", PROMPT[:PARTIAL_MIN_TOKENS])  # a prompt too short to leave an entry is not even planned
    applied(sched, sched.next_plan(0, 0), {})
    sched.cancel("short")
    assert not sched.next_plan(0, 0).stores


def test_the_ranks_keep_what_was_fed_up_to_the_prompt_but_its_last_token():
    store = Store(rid="a", entry=1, length=4999, least=256)
    assert [store.keeps(n) for n in (0, 255, 256, 4000, 4999, 5003)] == [0, 0, 256, 4000, 4999, 4999]
    assert Store(rid="a", entry=1, length=40).keeps(7) == 40  # a plain store names its length


def test_with_the_cache_off_nothing_is_kept():
    sched = make(budget=0)
    assert not cancel_mid_prefill(sched, "a", fed=3000).stores


def test_another_tenant_does_not_start_from_it():
    sched = make()
    cancel_mid_prefill(sched, "a", fed=3000, tenant="key-1")
    submit(sched, "b", PROMPT, tenant="key-2")
    (other,) = sched.next_plan(0, 0).inserts
    assert other.cache_id == 0


def test_it_is_held_bytes_within_the_budget_like_any_entry():
    sched = make(budget=3500)  # a byte per token: room for one of the two
    cancel_mid_prefill(sched, "a", fed=3000, tenant="key-1")
    cancel_mid_prefill(sched, "b", fed=2000, tenant="key-2")
    (entry,) = sched.prefix.entries.values()
    assert entry.tenant == "key-2" and entry.length == 2000  # the least recently used went
    assert sched.prefix.take_evictions() == [1]
