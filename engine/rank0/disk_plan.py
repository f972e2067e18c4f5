"""Rank 0's disk tier decisions for the plans: names for what is stored, restores for lookups the disk serves
better than RAM, and deletes of what longer entries superseded (engine/lockstep/disk.py applies them on every rank).

No MLX: the RAM index (engine/rank0/prefix_index.py) and the disk index (engine/rank0/disk_index.py) are plain data.
"""

from __future__ import annotations

from engine.diskcache.identity import entry_name
from engine.lockstep.plan import Restore
from engine.rank0.disk_index import DiskIndex
from engine.rank0.prefix_index import PrefixIndex


def disk_info(index: DiskIndex, tier_stats: dict | None) -> dict[str, float]:
    """The Info fields of the disk tier: rank 0's files (tier_stats: its DiskTier's stats(); None: not open) once its
    index is on (a cap of 0 says the tier is off or still opening), and the index's counts."""
    st = tier_stats if tier_stats is not None and index.enabled else {}
    return {"prompt_cache_disk_entries": int(st.get("entries", 0)), "prompt_cache_disk_bytes": int(st.get("bytes", 0)),
            "prompt_cache_disk_cap_bytes": int(st.get("cap", 0)),
            "prompt_cache_disk_hits": index.stats.hits, "prompt_cache_disk_restores": index.stats.restores,
            "prompt_cache_disk_restore_failures": index.stats.restore_failures,
            "prompt_cache_disk_writes": int(st.get("writes", 0)),
            "prompt_cache_disk_evictions": int(st.get("evictions", 0)),
            "prompt_cache_disk_bytes_restored": int(st.get("bytes_restored", 0)),
            "prompt_cache_disk_seconds_restoring": float(st.get("seconds_restoring", 0.0))}


class DiskPlanner:
    """What the next plan asks of the ranks' disk tiers."""

    def __init__(self, ram: PrefixIndex, index: DiskIndex | None = None) -> None:
        self.ram = ram
        self.index = index if index is not None else DiskIndex(ram.cuts)
        self.restores: list[Restore] = []
        self.deletes: list[str] = []
        self.headers: dict[str, dict] = {}  # what rank 0's file of each stored entry says (its tokens, tenant)

    def has_work(self) -> bool:
        return bool(self.restores or self.deletes or self.ram.superseded)

    def lookup(self, tokens: list[int], tenant: str, entry: int, reuse: int) -> tuple[int, int]:
        """The RAM lookup's (entry, reuse) for a prompt, or a disk entry's restored under a new entry id where it
        gives enough more (the stats then count the disk's tokens)."""
        name, n, found = self.index.choose(tokens, tenant, reuse)
        if found is None:
            return entry, reuse
        restored = self.ram.restored(found.tokens, tenant, found.prompt, name)
        self.restores.append(Restore(entry=restored, name=name, length=found.length))
        stats = self.ram.stats
        if not reuse:  # the RAM lookup counted a miss
            stats.misses -= 1
            stats.hits += 1
        stats.cached_tokens += n - reuse
        return restored, n

    def name(self, entry: int, tokens: list[int], tenant: str, prompt: int) -> str:
        """The disk name of a RAM entry being stored ("" while the disk tier is off); longer, it supersedes the
        tenant's disk entries it extends."""
        if not self.index.enabled or entry not in self.ram.entries:
            return ""
        name = entry_name(tenant, tokens)
        self.ram.entries[entry].disk = name
        self.deletes += self.index.supersede(tokens, tenant)
        self.index.stored(name, tokens, tenant, prompt)
        self.headers[name] = {"tokens": list(tokens), "tenant": tenant, "prompt": prompt}
        return name

    def take(self) -> tuple[list[Restore], list[str]]:
        """The next plan's restores and deletes."""
        superseded, self.ram.superseded = self.ram.superseded, []
        self.index.forget(superseded)
        restores, self.restores = self.restores, []
        deletes, self.deletes = list(dict.fromkeys(self.deletes + superseded)), []
        return restores, deletes

    def take_headers(self) -> dict[str, dict]:
        headers, self.headers = self.headers, {}
        return headers

    def restored(self, restores: list[Restore], failed: list[str]) -> None:
        """A plan's restores were applied; those some rank could not load are deleted on every rank next plan."""
        self.index.restored([r.name for r in restores], failed)
        self.deletes += failed
