"""Rank 0's disk index against its own tier's byte cap: an entry the LRU deleted from disk is not offered for a
restore (which would fail on every rank and count a restore failure), and the index does not grow without bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.diskcache.tier import DiskTier
from engine.lockstep.disk import DiskEntries
from engine.lockstep.results import StepResults
from tests.integration.test_disk_tier import entry, size_of_one
from tests.unit.test_disk_index import opened, plan, scheduler, submit

EOS = 0


@pytest.mark.xfail(strict=True, reason="the tier's LRU evictions never reach rank 0's DiskIndex")
def test_entries_the_cap_evicted_are_not_restored(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path / "tier", 2 * size_of_one(tmp_path) + 4096)
    disk = DiskEntries()
    disk.tier = tier
    sched = scheduler(opened())
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
