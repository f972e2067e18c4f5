"""What every rank decides alike from the table the ranks gathered: refuse, or which blobs go where.

No MLX: every rank runs this on the same table, so every rank takes part in the same transfers.
A row is [free bytes, bytes needed, files rank 0 lacks, have of each blob...] (see store.RankStore.have).
"""

from __future__ import annotations

from pathlib import Path

from config.hub_cache import Manifest
from config.hub_store import COMPLETE, Item
from ops.progress import human_bytes

HEAD = 3  # columns before the haves


class Plan:
    def __init__(self, table: list[list[int]], blobs: list[Item]):
        self.table = table
        self.blobs = blobs

    @property
    def size(self) -> int:
        return len(self.table)

    def have(self, rank: int, i: int) -> int:
        return self.table[rank][HEAD + i]

    def needing(self, i: int) -> list[int]:
        """The ranks that need blob i, in rank order."""
        return [r for r in range(1, self.size) if self.have(r, i) != COMPLETE]

    def start(self, i: int) -> int:
        """Where blob i's transfer starts: the shortest partial among the ranks that need it."""
        return min(max(self.have(r, i), 0) for r in self.needing(i))

    def refusal(self, manifest: Manifest, hosts: list[str], caches: list[Path]) -> str | None:
        """One sentence when the spread must not start, else None."""
        lacking = self.table[0][2]
        if lacking:
            return (f"rank 0's cache {caches[0]} lacks {lacking} of the {len(manifest.files)} file(s) of "
                    f"{manifest.repo} (or holds them at another size): download it again before spreading")
        for r in range(1, self.size):
            free, need = self.table[r][0], self.table[r][1]
            if need > free:
                host = hosts[r] if r < len(hosts) else f"rank {r}"
                return (f"host {host} (rank {r}) needs {human_bytes(need)} ({need} bytes) in {caches[r]} for "
                        f"{manifest.repo} but has {human_bytes(free)} ({free} bytes) free: nothing was copied; "
                        "free some space there or point its cache (HUB_CACHE, HUB_CACHE_PER_RANK) at a larger disk")
        return None
