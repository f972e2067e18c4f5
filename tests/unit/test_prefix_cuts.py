"""Rank 0's prefix cache on models whose entries cannot be cut (a linear-attention state, a sliding window that
has wrapped), without MLX: an entry is reused only whole, where a prompt extends it exactly, and the batch
keeps the state before the prompt's last token for the next turn (and the same prompt again)."""

from __future__ import annotations

from engine.lockstep.cuts import CacheCuts
from engine.lockstep.results import StepResults
from engine.rank0.prefix_index import PrefixIndex
from engine.rank0.requests import Counters
from engine.rank0.scheduler import Scheduler
from tests.unit.test_prefix_index import SYSTEM, applied, extract, request, submit
from tests.unit.test_scheduler import EOS

HYBRID = CacheCuts(whole_only=True)  # Qwen3.5, Qwen3-Next
WINDOW = CacheCuts(window=128)  # gpt-oss, Ministral 3


def make(cuts: CacheCuts) -> Scheduler:
    return Scheduler(8, {EOS}, Counters(), extract, PrefixIndex(10**9, cuts))


def run(sched: Scheduler, rid: str, tokens: list[int], answer: list[int]) -> tuple:
    """One request as the step loop drives it: (its Insert, the stores planned after its first token and after
    its end)."""
    submit(sched, request(rid, tokens, []))
    plan = sched.next_plan(0, 0)
    applied(sched, plan)
    (insert,) = plan.inserts
    stores = []
    for i, tok in enumerate(answer):
        sched.absorb(StepResults(tokens=[(rid, tok, "stop" if tok == EOS else None)]))
        later = sched.next_plan(0, 0)
        applied(sched, later)
        stores.append(later.stores)
    return insert, stores


def test_the_rule_follows_the_cache_kinds():
    assert CacheCuts().can_cut(10**6)
    assert not HYBRID.can_cut(5) and HYBRID.reusable(300, 300) == 300 and HYBRID.reusable(300, 299) == 0
    assert WINDOW.can_cut(127) and not WINDOW.can_cut(128)
    assert WINDOW.reusable(100, 40) == 40 and WINDOW.reusable(200, 150) == 0 and WINDOW.reusable(200, 200) == 200


def test_a_hybrid_models_prompt_end_is_kept_and_a_next_turn_extends_it():
    sched = make(HYBRID)
    turn1 = SYSTEM + [7, 8, 9]
    insert1, stores = run(sched, "a", turn1, [50, 51, 52, EOS])
    assert insert1.keep and insert1.keep_prompt
    # after the first token: all but the prompt's last token; after the last: every token fed, the EOS included
    assert [(s.rid, s.length) for s in stores[0]] == [("a", len(turn1) - 1)]
    assert [(s.rid, s.length) for s in stores[-1]] == [("a", len(turn1) + 4)]
    # the answer came back re-tokenised ([50, 5] for [50, 51, 52]): only the prompt's end serves, whole
    turn2 = turn1 + [50, 5, 11, 12]
    insert2, _ = run(sched, "b", turn2, [60, EOS])
    assert (insert2.cache_id, insert2.cache_len) == (stores[0][0].entry, len(turn1) - 1)


def test_an_entry_that_cannot_be_cut_never_serves_a_prompt_that_parts_inside_it():
    sched = make(HYBRID)
    run(sched, "a", SYSTEM + [7, 8, 9], [50, EOS])
    insert, _ = run(sched, "b", SYSTEM + [20, 21], [60, EOS])  # another question on the same system prompt
    assert (insert.cache_id, insert.cache_len) == (0, 0)


def test_the_same_prompt_again_computes_only_its_last_token_every_time():
    """A regenerated answer, a retry, an agent's identical probe: the prompt's last token must be computed (its
    logits start the answer), and the state before it serves every repeat; a repeat supersedes nothing."""
    sched = make(HYBRID)
    prompt = SYSTEM + [7, 8, 9]
    _, stores = run(sched, "a", prompt, [50, EOS])
    kept = stores[0][0].entry
    for rid in ("b", "c", "d"):
        insert, again = run(sched, rid, prompt, [60, EOS])
        assert (insert.cache_id, insert.cache_len) == (kept, len(prompt) - 1)
        assert all(s.length != len(prompt) - 1 for s in again[0])  # nothing new to store there
    assert kept in sched.prefix.entries


def test_where_conversations_part_is_kept_and_the_next_conversation_starts_there():
    sched = make(HYBRID)
    run(sched, "a", SYSTEM + [7, 8, 9], [50, EOS])
    insert, stores = run(sched, "b", SYSTEM + [20, 21], [60, EOS])
    # b parts from a's prompt after the system prompt: that state is kept besides b's prompt's end
    assert insert.keep_at == len(SYSTEM)
    assert sorted(s.length for s in stores[0]) == [len(SYSTEM), len(SYSTEM) + 1]
    for rid in ("c", "d"):  # every later conversation starts there (none supersedes it by going on from it)
        insert, _ = run(sched, rid, SYSTEM + [ord(rid), 31, 32], [70, EOS])
        assert insert.cache_len == len(SYSTEM) and insert.keep_at == 0  # nothing new to keep: it starts there


def test_a_short_shared_header_is_not_worth_a_state_of_its_own():
    sched = make(HYBRID)
    run(sched, "a", SYSTEM[:10] + [7, 8, 9] * 30, [50, EOS])
    insert, _ = run(sched, "b", SYSTEM[:10] + [20, 21] * 30, [60, EOS])
    assert insert.keep_at == 0


def test_a_next_turn_keeps_no_parting_inside_its_own_conversation():
    sched = make(HYBRID)
    turn1 = SYSTEM + [7, 8, 9]
    run(sched, "a", turn1, [50, 51, EOS])
    insert, _ = run(sched, "b", turn1 + [50, 5, 11], [60, EOS])  # its answer re-tokenised
    assert insert.cache_len == len(turn1) - 1 and insert.keep_at == 0


def test_an_entry_that_cannot_be_cut_leaves_the_shorter_ones_it_extends():
    sched = make(HYBRID)
    _, stores = run(sched, "a", SYSTEM + [7], [50, 51, EOS])
    prompt_end, whole = stores[0][0].entry, stores[-1][0].entry
    assert set(sched.prefix.entries) == {prompt_end, whole}
    # a sibling answer to the same prompt starts from the prompt's end, which the longer entry could not give
    insert, _ = run(sched, "b", SYSTEM + [7, 50, 9, 9], [60, EOS])
    assert (insert.cache_id, insert.cache_len) == (prompt_end, len(SYSTEM))


def test_a_sliding_window_cuts_entries_within_the_window_and_keeps_longer_prompts_whole():
    sched = make(WINDOW)
    short = list(range(100, 140))  # 40 tokens: its entries stay within the window
    insert, stores = run(sched, "a", short, [50, EOS])
    assert not insert.keep_prompt and [s.length for s in stores[-1]] == [len(short) + 1]
    insert, _ = run(sched, "b", short[:30] + [1, 2], [60, EOS])
    assert insert.cache_len == 30  # cut
    long = SYSTEM[:200]
    insert, stores = run(sched, "c", long, [50, EOS])
    assert insert.keep_prompt and [s.length for s in stores[0]] == [199]
    insert, _ = run(sched, "d", long + [3, 4], [60, EOS])
    assert (insert.cache_id, insert.cache_len) == (stores[0][0].entry, 199)
    insert, _ = run(sched, "e", long[:150] + [3, 4], [60, EOS])
    assert insert.cache_len < 128  # never a cut of the wrapped window: at most an entry within it


def test_plain_kv_models_plan_as_before():
    sched = make(CacheCuts())
    insert, stores = run(sched, "a", SYSTEM + [7], [50, 51, EOS])
    assert not insert.keep_prompt and stores[0] == []
    assert [s.length for s in stores[-1]] == [len(SYSTEM) + 1 + 2]


def test_concurrent_prompts_on_one_system_prompt_compute_it_once():
    sched = make(HYBRID)
    long_system = list(range(100, 700))
    submit(sched, *(request(f"s{i}", long_system + [10 + i, 5], []) for i in range(3)))
    # the first prompt's end cannot give the others anything, but where it parts from them can: they wait for it
    first = sched.next_plan(0, 0)
    assert [(i.rid, i.keep_at) for i in first.inserts] == [("s0", len(long_system))]
    applied(sched, first)
    sched.absorb(StepResults(tokens=[("s0", 50, None)]))
    second = sched.next_plan(0, 0)
    applied(sched, second)
    parting = [s.entry for s in second.stores if s.length == len(long_system)]
    assert [(i.rid, i.cache_id, i.cache_len) for i in second.inserts] == \
        [("s1", *parting, len(long_system)), ("s2", *parting, len(long_system))]


def test_concurrent_prompts_wait_for_a_prefill_only_where_its_entry_could_serve_them():
    sched = make(HYBRID)
    long_system = list(range(100, 700))
    submit(sched, request("s0", long_system + [10, 5], []))
    assert [i.rid for i in sched.next_plan(0, 0).inserts] == ["s0"]
    # s0 parts from nothing, so keeps only its prompt's end, which cannot give s1 its system prompt
    submit(sched, request("s1", long_system + [11, 5], []))
    assert [i.rid for i in sched.next_plan(0, 0).inserts] == ["s1"]


def test_pipeline_ranks_holding_different_layers_agree_on_the_strictest_rule():
    from engine.lockstep.cuts import CacheCuts

    # rank 0 holds a full-attention layer (any cut), rank 1 a 32-token sliding window, rank 2 a linear state
    assert CacheCuts.strictest([[0, 0], [0, 32]]) == CacheCuts(whole_only=False, window=32)
    assert CacheCuts.strictest([[0, 0], [0, 32], [1, 0]]) == CacheCuts(whole_only=True, window=32)
    assert CacheCuts.strictest([[0, 0], [0, 0]]) == CacheCuts()
