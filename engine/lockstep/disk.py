"""Every rank's side of the prefix cache's disk tier, as plans drive it: what a plan stores is written through to
this rank's DiskTier (engine/diskcache), what it supersedes is deleted once it is written, and what it restores is
loaded back.

Rank 0 decides everything (engine/rank0/disk_index.py). A restore is the one disk operation whose outcome can differ
between ranks (a file missing or damaged on one host), so the ranks agree on it in one small collective before any
of them uses the entry: an entry any rank could not load is dropped on every rank, and the insert that named it
computes its prompt from scratch. The answer never depends on the disk.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

# Sums one int32 row per rank over every rank (PlanChannel.gather); a single rank gets its own row back.
Agree = Callable[[list[int]], list[list[int]]]


def _alone(row: list[int]) -> list[list[int]]:
    return [list(row)]


class DiskEntries:
    """This rank's disk tier, off until it is opened (the model's identity is computed in the background)."""

    def __init__(self) -> None:
        self.tier: Any = None  # engine.diskcache.tier.DiskTier, set from the thread that opens it
        self.agree: Agree = _alone
        # rank 0: what its files say beyond the length (tokens, tenant), by name, until the store is applied
        self.headers: dict[str, dict] = {}
        self.failed: list[str] = []  # rank 0: names a restore could not load on some rank, since last taken

    def stored(self, name: str, cache: list[Any] | None, length: int, replaces: list[str] = ()) -> None:
        """A store was applied: the entry's cache as this rank keeps it (None: not kept) goes to disk too; the
        entries it supersedes are deleted once it is written (never, where it is not)."""
        header = self.headers.pop(name, {})
        tier = self.tier
        if not name or cache is None or tier is None:
            return
        try:
            tier.put(name, cache, {**header, "length": length}, replaces=list(replaces))
        except Exception:  # the RAM entry stands; a restore of it later fails alike on every rank and computes
            log.exception("prefix entry %s could not be written to the disk tier", name)

    def delete(self, names: list[str]) -> None:
        tier = self.tier
        for name in names if tier is not None else ():
            try:
                tier.delete(name)
            except Exception:
                log.exception("disk entry %s could not be deleted", name)

    def load(self, name: str) -> list[Any] | None:
        """This rank's file of the entry, or None (no tier yet, missing, damaged: the tier deletes a damaged one)."""
        tier = self.tier
        if tier is None:
            return None
        try:
            return tier.load(name)
        except Exception:
            log.exception("disk entry %s could not be read", name)
            return None

    def agreed(self, kept: list[bool]) -> list[bool]:
        """Whether every rank kept each restored entry: one all_sum of this rank's failure flags."""
        rows = self.agree([0 if k else 1 for k in kept])
        return [not any(row[i] for row in rows) for i in range(len(kept))]

    def take_failed(self) -> list[str]:
        out, self.failed = self.failed, []
        return out

    def close(self) -> None:
        """The engine stops: what the tier still has queued is written, then it closes."""
        tier, self.tier = self.tier, None
        if tier is not None:
            try:
                tier.close()
            except Exception:
                log.exception("the disk tier could not be closed cleanly")

    def settle(self) -> None:
        """Idle: every store planned has been applied; headers of stores no rank kept go."""
        self.headers.clear()
