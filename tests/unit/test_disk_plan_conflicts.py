"""Rank 0's disk plans where a restore and a delete meet: a linear-attention (whole-state) conversation that branches
(an edited last message, a sibling request from the same context) still restores the entry both branches extend."""

from __future__ import annotations

from engine.lockstep.cuts import CacheCuts
from engine.lockstep.results import StepResults
from tests.unit.test_disk_index import TURN, header, opened, plan, scheduler, submit

EOS = 0


def test_a_branch_restoring_the_entry_its_sibling_just_extended_finds_it_on_disk() -> None:
    whole = CacheCuts(whole_only=True)
    index = opened(("turn-1", header(TURN, "t")), cuts=whole)
    sched = scheduler(index)
    sched.prefix.cuts = whole
    submit(sched, "a", TURN + [7, 8], tenant="t")
    first = plan(sched)
    sched.disk.restored(first.restores, [])
    sched.prefix.applied({first.restores[0].entry: 1000})
    sched.absorb(StepResults(reused={"a": 300}))
    sched.absorb(StepResults(tokens=[("a", 5, None)]))
    sched.absorb(StepResults(tokens=[("a", EOS, "stop")]))
    # the sibling branch: only turn-1 serves it (a whole state is never cut back to a shorter prompt)
    submit(sched, "b", TURN + [6, 9], tenant="t")
    second = plan(sched)
    assert [r.name for r in second.restores] == ["turn-1"]
    # every rank deletes before it restores: deleting it in this very plan makes the restore fail on every rank
    assert "turn-1" not in second.disk_deletes


class Files:
    """Rank 0's tier as the planner asks it: each file's size (3 GiB: a long context of a large model)."""

    def size(self, name: str) -> int:
        return 3 << 30

    def take_evicted(self) -> list[str]:
        return []


def test_one_plan_restores_no_more_bytes_than_a_step_can_read_within_the_watchdog() -> None:
    other, third = list(range(5000, 5300)), list(range(6000, 6300))
    sched = scheduler(opened(("turn-a", header(TURN)), ("turn-b", header(other)), ("turn-c", header(third))))
    sched.disk.tier = Files()
    submit(sched, "a", TURN + [7])
    submit(sched, "b", other + [7])
    first = plan(sched)
    assert [r.name for r in first.restores] == ["turn-a"]
    assert {i.rid: i.cache_len for i in first.inserts} == {"a": 300, "b": 0}  # b computes its prompt
    assert sched.disk.index.stats.hits == 1
    submit(sched, "c", third + [7])  # the next plan has its own budget
    assert [r.name for r in plan(sched).restores] == ["turn-c"]
