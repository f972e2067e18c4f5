"""Rank 0's disk index against its own tier's byte cap: an entry the LRU deleted from disk is not offered for a
restore (which would fail on every rank and count a restore failure), and the index does not grow without bound."""

from __future__ import annotations

import threading
from pathlib import Path

from engine.diskcache import files
from engine.diskcache.tier import DiskTier
from engine.lockstep.disk import DiskEntries
from engine.lockstep.results import StepResults
from tests.integration.test_disk_tier import entry, size_of_one
from tests.unit.test_disk_index import opened, plan, scheduler, submit

EOS = 0


def test_entries_the_cap_evicted_are_not_restored(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path / "tier", 2 * size_of_one(tmp_path) + 4096)
    disk = DiskEntries()
    disk.tier = tier
    sched = scheduler(opened())
    sched.disk.tier = tier  # as the engine hands rank 0's planner its tier once open
    turns = [[1000 * (c + 1) + i for i in range(300)] for c in range(5)]
    for c, turn in enumerate(turns):  # five conversations end one after another, each written through
        submit(sched, f"c{c}", turn)
        plan(sched)
        sched.absorb(StepResults(reused={f"c{c}": 0}))
        sched.absorb(StepResults(tokens=[(f"c{c}", EOS, "stop")]))
        (store,) = plan(sched).stores
        disk.headers.update(sched.disk.take_headers())
        disk.stored(store.disk, entry(c), 300)
        assert tier.flush(30)
    sched.prefix.applied({e: 1000 for e in sched.prefix.entries})
    sched.prefix.fit(0)  # RAM pressure: only the disk tier holds them now
    assert not sched.prefix.entries
    on_disk = set(tier.names())
    tier.close()
    assert len(on_disk) == 2
    submit(sched, "next", turns[0] + [7])  # the first conversation's file went first
    assert plan(sched).restores == []
    assert set(sched.disk.index.entries) <= on_disk


def test_a_turn_whose_write_is_skipped_keeps_the_turn_before_on_disk(tmp_path: Path, monkeypatch) -> None:
    tier = DiskTier(tmp_path / "tier", 1 << 30, queue_entries=1)
    disk = DiskEntries()
    disk.tier = tier
    sched = scheduler(opened())
    turn = list(range(1000, 1300))
    submit(sched, "t1", turn)
    plan(sched)
    sched.absorb(StepResults(reused={"t1": 0}))
    sched.absorb(StepResults(tokens=[("t1", EOS, "stop")]))
    (first,) = plan(sched).stores
    disk.headers.update(sched.disk.take_headers())
    disk.stored(first.disk, entry(1), 300)
    assert tier.flush(30) and tier.names() == [first.disk]
    # other conversations' writes keep the writer busy (a slow disk, many agents ending at once)
    writing, gate, real = threading.Event(), threading.Event(), files.write_file
    monkeypatch.setattr(files, "write_file", lambda *a: (writing.set(), gate.wait(30), real(*a))[2])
    disk.stored("busy-1", entry(2), 300)
    assert writing.wait(30)
    disk.stored("busy-2", entry(3), 300)  # the queue is full now
    submit(sched, "t2", turn + [7, 8])  # the conversation's next turn, from its RAM entry
    plan(sched)
    sched.absorb(StepResults(reused={"t2": 299}))
    sched.absorb(StepResults(tokens=[("t2", EOS, "stop")]))
    second = plan(sched)
    (store,) = second.stores
    disk.headers.update(sched.disk.take_headers())
    disk.delete(second.disk_deletes)  # as a rank applies the plan: deletes, then stores
    disk.stored(store.disk, entry(4), 302)
    gate.set()
    assert tier.flush(30)
    tier.close()
    assert {first.disk, store.disk} & set(tier.names()), "after a restart the conversation is computed whole"
