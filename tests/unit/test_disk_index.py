"""Rank 0's disk tier decisions without MLX: which disk entry a prompt restores (its tenant's only, and only where it
gives more than RAM), what a plan stores under which name and deletes, and how a restore no rank could keep ends."""

from __future__ import annotations

import math

from engine.lockstep.cuts import CacheCuts
from engine.lockstep.plan import Insert
from engine.lockstep.results import StepResults
from engine.rank0.disk_index import MIN_RESTORE_TOKENS, DiskIndex
from engine.rank0.disk_plan import DiskPlanner
from engine.rank0.prefix_index import PrefixIndex, token_bytes
from engine.rank0.requests import Counters, Request
from engine.rank0.scheduler import Scheduler
from ipc import Finish

EOS = 0
TURN = list(range(100, 400))  # a conversation's first 300 tokens, as a disk file's header says them


class Detok:
    last_segment = ""

    def add_token(self, token: int) -> None:
        pass

    def finalize(self) -> None:
        pass


class Splitter:
    stop_sequence = None

    def feed(self, text):
        from engine.rank0.piece import Piece
        return Piece(content=text), False

    def finish(self, reason="stop"):
        from engine.rank0.piece import Piece
        return Piece()


def header(tokens: list[int], tenant: str = "", prompt: int | None = None) -> dict:
    return {"tokens": token_bytes(tokens), "tenant": tenant, "length": len(tokens),
            "prompt": len(tokens) if prompt is None else prompt}


def opened(*files: tuple[str, dict], cuts: CacheCuts = CacheCuts()) -> DiskIndex:
    """An index as rank 0 has it once its start-up scan read these files."""
    index = DiskIndex(cuts)
    for name, head in files:
        index.arrive(name, head)
    index.scan_done()
    return index


def submit(sched: Scheduler, rid: str, tokens: list[int], tenant: str = "") -> None:
    assert sched.counters.admit(1, capacity=100)
    sched.submit([Request(insert=Insert(rid=rid, tokens=tokens, max_tokens=8), outbox=[], prompt_tokens=len(tokens),
                          deadline=math.inf, detok=Detok(), splitter=Splitter(), group=rid, tenant=tenant)])


def scheduler(index: DiskIndex) -> Scheduler:
    ram = PrefixIndex(10**9)
    return Scheduler(8, {EOS}, Counters(), lambda *a: [], ram, disk=DiskPlanner(ram, index))


def plan(sched: Scheduler):
    return sched.next_plan(fingerprint=0, token_check=0, idle=not sched.has_work())


def test_a_scanned_entry_is_restored_for_its_tenants_next_turn_and_never_for_another_tenant() -> None:
    sched = scheduler(opened(("a-turn", header(TURN, "tenant-a"))))
    submit(sched, "b", TURN + [7, 8], tenant="tenant-b")
    submit(sched, "a", TURN + [7, 8], tenant="tenant-a")
    first = plan(sched)
    by_rid = {i.rid: i for i in first.inserts}
    assert by_rid["b"].cache_len == 0
    (restore,) = first.restores
    assert (restore.name, restore.length) == ("a-turn", 300)
    assert (by_rid["a"].cache_id, by_rid["a"].cache_len) == (restore.entry, 300)
    assert sched.disk.index.stats.hits == 1 and sched.prefix.stats.cached_tokens == 300


def test_nothing_is_restored_before_the_start_up_scan_is_done() -> None:
    index = DiskIndex()
    index.arrive("a-turn", header(TURN))
    sched = scheduler(index)
    submit(sched, "a", TURN + [7])
    assert plan(sched).restores == []
    index.scan_done()
    assert index.choose(TURN + [7], "", 0)[:2] == ("a-turn", 300)


def test_a_disk_entry_is_restored_only_where_it_gives_enough_more_than_ram() -> None:
    index = opened(("long", header(TURN)))
    sched = scheduler(index)
    ram = sched.prefix.add(TURN[:300 - MIN_RESTORE_TOKENS + 1])
    sched.prefix.applied({ram: 1000})
    submit(sched, "a", TURN + [7])
    first = plan(sched)
    assert first.restores == [] and first.inserts[0].cache_id == ram  # a few tokens more are computed faster
    index2 = opened(("long", header(TURN)))
    sched2 = scheduler(index2)
    ram2 = sched2.prefix.add(TURN[:300 - MIN_RESTORE_TOKENS])
    sched2.prefix.applied({ram2: 1000})
    submit(sched2, "a", TURN + [7])
    assert [r.name for r in plan(sched2).restores] == ["long"]


def test_an_entry_that_cannot_be_cut_is_restored_only_for_a_prompt_extending_it_whole() -> None:
    index = opened(("state", header(TURN)), cuts=CacheCuts(whole_only=True))
    sched = scheduler(index)
    submit(sched, "parts", TURN[:200] + [9, 9, 9])
    assert plan(sched).restores == []
    submit(sched, "extends", TURN + [9])
    assert [r.name for r in plan(sched).restores] == ["state"]


def test_files_without_tokens_of_their_own_length_are_not_indexed() -> None:
    index = opened(("follower", {"length": 300}), ("short", header([1, 2])),
                   ("lying", {**header(TURN), "length": 299}), ("good", header(TURN)))
    assert index.choose(TURN + [1], "", 0)[0] == "good"
    assert set(index.entries) == {"good"}


def test_a_stored_turn_is_named_written_through_and_deletes_the_turn_it_extends_on_disk() -> None:
    index = opened(("turn-1", header(TURN, "t")), ("other-tenant", header(TURN, "u")))
    sched = scheduler(index)
    submit(sched, "a", TURN + [7, 8], tenant="t")
    first = plan(sched)
    sched.absorb(StepResults(reused={"a": 300}))
    sched.absorb(StepResults(tokens=[("a", 5, None)]))
    sched.absorb(StepResults(tokens=[("a", EOS, "stop")]))
    second = plan(sched)
    (store,) = second.stores
    assert store.disk and store.disk not in ("turn-1", "other-tenant")
    # the conversation's earlier turn is superseded in RAM (restored there) and so on disk, once the store is written;
    # the other tenant's stays
    assert store.replaces == ["turn-1"] and second.disk_deletes == []
    assert set(index.entries) == {store.disk, "other-tenant"}
    assert sched.disk.take_headers()[store.disk] == {"tokens": token_bytes(TURN + [7, 8, 5]), "tenant": "t", "prompt": 302}
    assert first.restores[0].name == "turn-1"


def test_a_restore_some_rank_could_not_load_counts_no_cached_tokens_and_is_deleted_everywhere() -> None:
    index = opened(("turn-1", header(TURN)))
    sched = scheduler(index)
    submit(sched, "a", TURN + [7])
    first = plan(sched)
    # every rank dropped it (applied on rank 0: the entry is absent from what the ranks hold) and computed the prompt
    sched.disk.restored(first.restores, ["turn-1"])
    sched.prefix.applied({})
    sched.absorb(StepResults(reused={"a": 0}))
    sched.absorb(StepResults(tokens=[("a", EOS, "stop")]))
    finish = [m for _, m in sched.take_events() if isinstance(m, Finish)][0]
    assert finish.cached_tokens == 0
    assert (index.stats.restores, index.stats.restore_failures) == (0, 1)
    assert sched.prefix.stats.cached_tokens == 0 and sched.prefix.stats.hits == 0
    assert "turn-1" in plan(sched).disk_deletes and "turn-1" not in index.entries
    submit(sched, "again", TURN + [7])
    assert plan(sched).restores == []


def test_an_entry_one_rank_could_not_load_is_kept_by_no_rank() -> None:
    from engine.lockstep.disk import DiskEntries

    disk = DiskEntries()
    # this rank loaded both; the other rank's row flags the second as missing or damaged
    disk.agree = lambda row: [list(row), [0, 1]]
    assert disk.agreed([True, True]) == [True, False]
    assert DiskEntries().agreed([True, False]) == [True, False]  # a single rank agrees with itself
