"""Rank 0's prefix cache decisions without MLX: lookup, what each plan stores and evicts, the byte budget.

The scheduler is driven as the step loop drives it: next_plan, then the step's results, then the
sizes every rank reports holding after a plan applied (here: a byte per token).
"""

from __future__ import annotations

import math

from engine.lockstep.plan import Insert
from engine.lockstep.results import StepResults
from engine.rank0.prefix_index import MIN_REUSE_TOKENS, PrefixIndex, prompt_cache_budget, token_bytes
from engine.rank0.prefix_index import common_prefix as common_prefix_of_bytes
from engine.rank0.requests import Counters, Request
from engine.rank0.scheduler import Scheduler
from ipc import Finish
from ipc.messages import RankState
from tests.unit.test_scheduler import EOS, Detok, TextSplitter, extract

SYSTEM = list(range(100, 400))  # a 300-token system prompt


def make(budget: int) -> Scheduler:
    return Scheduler(8, {EOS}, Counters(), extract, PrefixIndex(budget))


def request(rid: str, tokens: list[int], outbox: list) -> Request:
    return Request(insert=Insert(rid=rid, tokens=tokens, max_tokens=8), outbox=outbox, prompt_tokens=len(tokens),
                   deadline=math.inf, detok=Detok(), splitter=TextSplitter(), group=rid)


def submit(sched: Scheduler, *reqs: Request) -> None:
    assert sched.counters.admit(len(reqs), capacity=100)
    for r in reqs:
        sched.submit([r])


def applied(sched: Scheduler, plan) -> None:
    """Every rank applied plan: it holds the index's entries (a byte per token)."""
    if plan.stores or plan.evicts:
        sched.prefix.applied({i: e.length for i, e in sched.prefix.entries.items()})


def run(sched: Scheduler, rid: str, tokens: list[int], answer: list[int]) -> tuple:
    """One request from submission to its Finish: (its Insert, its Finish, the plan that stored it)."""
    outbox: list = []
    submit(sched, request(rid, tokens, outbox))
    plan = sched.next_plan(0, 0)
    applied(sched, plan)
    (insert,) = plan.inserts
    for i, tok in enumerate(answer):
        sched.absorb(StepResults(tokens=[(rid, tok, "stop" if tok == EOS else None)]))
    (finish,) = [ev for _, ev in sched.take_events() if isinstance(ev, Finish)]
    store_plan = sched.next_plan(0, 0)
    applied(sched, store_plan)
    return insert, finish, store_plan


def common_prefix(a: list[int], b: list[int]) -> int:
    return common_prefix_of_bytes(token_bytes(a), token_bytes(b))


def test_common_prefix_finds_the_first_difference():
    assert common_prefix([1, 2, 3, 4], [1, 2, 9]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix(list(range(10_000)), list(range(7_777)) + [0]) == 7_777
    assert common_prefix([256], [1]) == 0  # tokens differ, not just bytes
    assert common_prefix([1, 256], [1, 1]) == 1


def test_a_second_turn_reuses_the_first_turns_prompt_and_answer():
    sched = make(10**9)
    turn1 = SYSTEM + [7, 8, 9]
    insert1, finish1, stored = run(sched, "a", turn1, [50, 51, 52, EOS])
    assert insert1.cache_id == 0 and insert1.keep and finish1.cached_tokens == 0
    # every token fed to the model: the prompt and the answer except the EOS that ended it
    (store,) = stored.stores
    assert store.rid == "a" and store.length == len(turn1) + 3
    turn2 = turn1 + [50, 51, 52] + [11, 12]
    insert2, finish2, _ = run(sched, "b", turn2, [60, EOS])
    assert (insert2.cache_id, insert2.cache_len) == (store.entry, len(turn1) + 3)
    assert finish2.cached_tokens == len(turn1) + 3


def test_another_conversation_with_the_same_system_prompt_reuses_only_the_system_prompt():
    sched = make(10**9)
    run(sched, "a", SYSTEM + [7, 8, 9], [50, EOS])
    insert, finish, _ = run(sched, "b", SYSTEM + [20, 21], [60, EOS])
    assert insert.cache_len == len(SYSTEM) and finish.cached_tokens == len(SYSTEM)


def test_the_last_prompt_token_is_always_computed():
    sched = make(10**9)
    run(sched, "a", SYSTEM, [50, 51, EOS])
    insert, _, _ = run(sched, "b", SYSTEM, [60, EOS])  # the same prompt again
    assert insert.cache_len == len(SYSTEM) - 1


def test_short_prompts_neither_reuse_nor_store():
    sched = make(10**9)
    short = list(range(MIN_REUSE_TOKENS - 2))
    _, _, stored = run(sched, "a", short, [5, EOS])
    assert not stored.stores and not sched.prefix.entries


def test_an_entry_that_a_longer_one_extends_is_evicted_as_redundant():
    sched = make(10**9)
    _, _, first = run(sched, "a", SYSTEM + [7], [50, EOS])
    _, _, second = run(sched, "b", SYSTEM + [7, 50, 8], [60, EOS])
    # the plan that stores the longer entry evicts the one it extends
    assert second.evicts == [first.stores[0].entry]
    assert list(sched.prefix.entries) == [second.stores[0].entry]


def test_a_next_turn_supersedes_the_entry_it_started_from_even_where_the_answer_retokenised_differently():
    sched = make(10**9)
    _, _, first = run(sched, "a", SYSTEM + [7], [50, 51, 52, EOS])
    # the answer comes back re-tokenised: [50, 5, 1] instead of the sampled [50, 51, 52]
    insert, _, second = run(sched, "b", SYSTEM + [7, 50, 5, 1, 8], [60, EOS])
    assert insert.cache_id == first.stores[0].entry and insert.cache_len == len(SYSTEM) + 2
    assert second.evicts == [first.stores[0].entry]
    assert list(sched.prefix.entries) == [second.stores[0].entry]


def test_another_conversation_on_the_same_system_prompt_leaves_the_long_entry_it_started_from():
    sched = make(10**9)
    long_history = SYSTEM + list(range(1000, 1600))  # a conversation far past its system prompt
    _, _, first = run(sched, "a", long_history, [50, EOS])
    _, _, other = run(sched, "b", SYSTEM + [9, 9], [60, EOS])
    assert other.evicts == [] and len(sched.prefix.entries) == 2


def test_concurrent_prompts_with_one_long_system_prompt_compute_it_once():
    sched = make(10**9)
    long_system = list(range(100, 700))  # 600 tokens, beyond SHARE_MIN_TOKENS
    outboxes: list[list] = [[], [], []]
    submit(sched, *(request(f"s{i}", long_system + [10 + i], outboxes[i]) for i in range(3)))
    first = sched.next_plan(0, 0)
    assert [i.rid for i in first.inserts] == ["s0"]  # the others wait for its prefill
    applied(sched, first)
    assert sched.next_plan(0, 0).inserts == []  # still prefilling: no token yet
    sched.absorb(StepResults(tokens=[("s0", 50, None)]))  # its prompt is done
    second = sched.next_plan(0, 0)
    applied(sched, second)
    (store,) = second.stores
    assert store.rid == "s0" and store.length == len(long_system) + 1
    assert [(i.rid, i.cache_id, i.cache_len) for i in second.inserts] == \
        [("s1", store.entry, len(long_system)), ("s2", store.entry, len(long_system))]


def test_a_short_shared_prefix_does_not_hold_a_prompt_back():
    sched = make(10**9)
    submit(sched, *(request(f"s{i}", SYSTEM + [10 + i], []) for i in range(2)))  # 300 shared: above the bar
    assert len(sched.next_plan(0, 0).inserts) == 1
    sched = make(10**9)
    short = list(range(100, 200))  # 100 shared tokens: not worth a wait
    submit(sched, *(request(f"s{i}", short + [10 + i], []) for i in range(2)))
    assert len(sched.next_plan(0, 0).inserts) == 2


def test_prompt_tokens_are_counted_with_the_cache_off_too():
    sched = make(0)
    run(sched, "a", SYSTEM + [7], [50, EOS])
    assert sched.prefix.stats.prompt_tokens == len(SYSTEM) + 1 and sched.prefix.stats.cached_tokens == 0


def test_entries_beyond_the_byte_budget_are_evicted_least_recently_used_first():
    sched = make(budget=2 * 320)  # room for two entries of ~310 tokens
    entries = []
    for i in range(3):
        _, _, stored = run(sched, f"r{i}", [i] + SYSTEM + [7], [50 + i, EOS])
        entries.append(stored.stores[0].entry)
    evicted = sched.next_plan(0, 0).evicts
    assert evicted == [entries[0]] and sched.prefix.nbytes <= 2 * 320
    assert sched.prefix.stats.evictions == 1


def test_a_removed_sequence_is_stored_with_the_tokens_it_had_computed():
    sched = make(10**9)
    outbox: list = []
    submit(sched, request("a", SYSTEM + [7], outbox))
    sched.next_plan(0, 0)
    for tok in (50, 51, 52):
        sched.absorb(StepResults(tokens=[("a", tok, None)]))
    sched.cancel("a")
    plan = sched.next_plan(0, 0)
    assert plan.removes == ["a"]
    (store,) = plan.stores
    assert store.length == len(SYSTEM) + 1 + 2  # the last sampled token was never fed to the model


def test_a_failed_sequence_is_not_stored():
    sched = make(10**9)
    submit(sched, request("a", SYSTEM + [7], []))
    sched.next_plan(0, 0)
    sched.absorb(StepResults(tokens=[("a", 50, None)]))
    sched.absorb(StepResults(failed={"a": "boom"}))
    assert not sched.next_plan(0, 0).stores


def test_with_the_cache_off_nothing_is_kept():
    sched = make(0)
    insert, finish, stored = run(sched, "a", SYSTEM + [7], [50, EOS])
    assert not insert.keep and insert.cache_id == 0 and not stored.stores and finish.cached_tokens == 0


def test_entries_the_ranks_did_not_keep_are_forgotten():
    sched = make(10**9)
    _, _, stored = run(sched, "a", SYSTEM + [7], [50, EOS])
    sched.prefix.applied({})  # e.g. the KV was shorter than planned on every rank
    assert not sched.prefix.entries
    insert, _, _ = run(sched, "b", SYSTEM + [7, 50, 1], [60, EOS])
    assert insert.cache_id == 0


def test_the_default_budget_is_a_quarter_of_what_the_smallest_rank_has_left():
    ranks = [RankState(rank=0, host_memory_total=64 << 30, active_memory=40 << 30),
             RankState(rank=1, host_memory_total=32 << 30, active_memory=16 << 30)]
    assert prompt_cache_budget(-1, ranks) == (16 << 30) // 4
    assert prompt_cache_budget(0, ranks) == 0
    assert prompt_cache_budget(123, ranks) == 123
    assert prompt_cache_budget(-1, [RankState(rank=0)]) == 0  # memory unknown: off


def test_conversations_taking_turns_on_one_system_prompt_each_keep_their_history():
    # Two (then twelve) conversations share a system prompt and take turns: each turn must compute only
    # its new user message and the last answer, however many turns came before, not its whole history.
    for conversations in (2, 12):
        sched = make(10**9)
        history = {c: SYSTEM + [2000 + c] * 5 for c in range(conversations)}
        computed = {c: [] for c in range(conversations)}
        for turn in range(5):
            for c in range(conversations):
                answer = [3000 + 100 * c + turn + k for k in range(20)]
                insert, _, _ = run(sched, f"c{c}t{turn}", history[c], answer + [EOS])
                computed[c].append(len(history[c]) - insert.cache_len)
                history[c] = history[c] + answer + [4000 + c] * 5  # the answer, then the next user message
        for c, counts in computed.items():
            assert max(counts[1:]) <= 26, f"{conversations} conversations: conversation {c} computed {counts}"


def test_a_regenerated_answer_leaves_the_first_answer_cached():
    sched = make(10**9)
    _, _, first = run(sched, "a", SYSTEM + [7], [50, 51, 52, EOS])
    _, _, again = run(sched, "b", SYSTEM + [7], [60, 61, EOS])  # the same prompt, another answer
    assert again.evicts == [] and len(sched.prefix.entries) == 2


def test_a_tenant_never_reuses_or_supersedes_another_tenants_entries():
    index = PrefixIndex(10**9)
    mine = index.add(SYSTEM + [7, 8, 9], tenant="a")
    index.applied({mine: 303})
    assert index.lookup(SYSTEM + [7, 8, 9, 10], tenant="b") == (0, 0)
    assert index.lookup(SYSTEM + [7, 8, 9, 10], tenant="a") == (mine, 303)
    # b's own copy of the same tokens is an entry of its own, and a's stays
    theirs = index.add(SYSTEM + [7, 8, 9, 10], tenant="b")
    assert theirs is not None and set(index.entries) == {mine, theirs} and not index.take_evictions()
