"""Rank 0's disk tier decisions for the plans: names for what is stored, restores for lookups the disk serves
better than RAM, and what longer entries supersede: deleted once those are written (engine/lockstep/disk.py applies them
on every rank).

No MLX: the RAM index (engine/rank0/prefix_index.py) and the disk index (engine/rank0/disk_index.py) are plain data.
"""

from __future__ import annotations

from typing import Any

import msgspec

from engine.diskcache.identity import entry_name
from engine.lockstep.plan import Restore, Store
from engine.rank0.disk_index import DiskIndex
from engine.rank0.prefix_index import PrefixIndex, token_bytes
from engine.vision.ids import has_images


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


# Bytes of entries one plan restores at most: every rank reads (and checks) them inside one step, which must end
# within WATCHDOG_TIMEOUT (30 s) even on a slow disk (4 GiB at 500 MB/s is 8 s); a prompt past it computes.
RESTORE_BYTES = 4 << 30


class DiskPlanner:
    """What the next plan asks of the ranks' disk tiers."""

    def __init__(self, ram: PrefixIndex, index: DiskIndex | None = None) -> None:
        self.ram = ram
        self.index = index if index is not None else DiskIndex(ram.cuts)
        self.restores: list[Restore] = []
        self.deletes: list[str] = []
        self.headers: dict[str, dict] = {}  # what rank 0's file of each stored entry says (its tokens, tenant)
        self.replaces: dict[str, list[str]] = {}  # name of an entry being stored -> the disk entries it supersedes
        self.tier: Any = None  # rank 0's DiskTier once open: the names its byte cap evicted are forgotten each plan
        self.restore_bytes = RESTORE_BYTES
        self.restoring = 0  # bytes of the restores planned so far for the next plan (rank 0's file sizes)

    def has_work(self) -> bool:
        return bool(self.restores or self.deletes or self.ram.superseded)

    def lookup(self, tokens: list[int], tenant: str, entry: int, reuse: int) -> tuple[int, int]:
        """The RAM lookup's (entry, reuse) for a prompt, or a disk entry's restored under a new entry id where it
        gives enough more (the stats then count the disk's tokens)."""
        name, n, found = self.index.choose(tokens, tenant, reuse)
        if found is None:
            return entry, reuse
        size = self.tier.size(name) if self.tier is not None else 0
        if self.restoring + size > self.restore_bytes:  # this plan reads enough already: the prompt computes
            self.index.stats.hits -= 1
            return entry, reuse
        self.restoring += size
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
        if not self.index.enabled or entry not in self.ram.entries or has_images(tokens):
            # an image's token ids hold for this engine's life only (engine/vision/ids.py): never on disk
            return ""
        name = entry_name(tenant, tokens)
        self.ram.entries[entry].disk = name
        # what it supersedes (on disk, and the RAM entries the add just replaced) goes once it is written; the
        # index forgets the RAM ones in take(), where a lookup of this same plan restores none of them
        replaces = [n for n in dict.fromkeys(self.index.supersede(tokens, tenant) + self.ram.superseded) if n != name]
        self.ram.superseded = []
        self.replaces[name] = replaces
        self.index.stored(name, tokens, tenant, prompt)
        # tokens packed (4 bytes each): a msgpack list makes a Python int per token, 3x the start-up scan
        self.headers[name] = {"tokens": token_bytes(tokens), "tenant": tenant, "prompt": prompt}
        return name

    def take(self, stores: list[Store]) -> tuple[list[Store], list[Restore], list[str]]:
        """The next plan's stores (with what each supersedes), restores and deletes."""
        restores, self.restores, self.restoring = self.restores, [], 0
        tier = self.tier
        if tier is not None:  # before any lookup of the next plan could choose one of them
            self.index.forget(tier.take_evicted())
        # every rank deletes before it restores: a name this plan restores stays (its restored RAM entry carries
        # the name, so the entry superseding that one deletes it later)
        reading = {r.name for r in restores}
        superseded, self.ram.superseded = [n for n in self.ram.superseded if n not in reading], []
        self.index.forget(superseded)
        deletes = [n for n in dict.fromkeys(self.deletes + superseded) if n not in reading]
        self.deletes = []
        out = []
        for st in stores:
            replaces = [n for n in self.replaces.pop(st.disk, ()) if n not in reading]
            self.index.forget(replaces)
            out.append(msgspec.structs.replace(st, replaces=replaces) if replaces else st)
        self.replaces.clear()  # a store named but not planned (none today) supersedes nothing
        return out, restores, deletes

    def take_headers(self) -> dict[str, dict]:
        headers, self.headers = self.headers, {}
        return headers

    def restored(self, restores: list[Restore], failed: list[str]) -> None:
        """A plan's restores were applied; those some rank could not load are deleted on every rank next plan."""
        self.index.restored([r.name for r in restores], failed)
        self.deletes += failed
