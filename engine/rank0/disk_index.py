"""Rank 0's index of the prefix cache's disk tier: which token sequences the ranks' files hold, and which to restore.

No MLX here (token prefixes compare as bytes, engine/rank0/prefix_index.py). The index is rebuilt at start-up from
rank 0's own files, read by a background thread (`arrive`) while the tier is still off (serving never waits for the
disk); the scheduler takes what arrived at its first lookup after. Entries stored since join it at once. Only rank 0's files are read: a file
another rank lacks or finds damaged is caught when the restore is applied (engine/lockstep/disk.py), and computed.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from engine.lockstep.cuts import CacheCuts
from engine.rank0.prefix_index import MIN_REUSE_TOKENS, common_prefix, token_bytes

log = logging.getLogger(__name__)

# A restore reads a whole entry's KV from disk; it is planned only where it gives this many more prompt tokens than
# the RAM tier: fewer are computed faster than a file is opened and checked.
MIN_RESTORE_TOKENS = 32


@dataclass
class DiskEntry:
    tokens: bytes  # token_bytes of the tokens its KV covers
    tenant: str
    prompt: int  # how many of them were a prompt (the rest generated): see PrefixIndex.add

    @property
    def length(self) -> int:
        return len(self.tokens) // 4


@dataclass
class DiskStats:
    hits: int = 0  # lookups that chose a disk entry (a restore planned)
    restores: int = 0  # restores every rank loaded
    restore_failures: int = 0  # restores some rank could not load (the prompt was computed)


def _entry(header: dict) -> DiskEntry | None:
    """A file's header as an entry, or None where it lacks what rank 0 writes (tokens, an int length)."""
    tokens = header.get("tokens")
    if not isinstance(tokens, list) or len(tokens) != header.get("length") or len(tokens) < MIN_REUSE_TOKENS:
        return None
    prompt = header.get("prompt", len(tokens))
    try:
        return DiskEntry(token_bytes(tokens), str(header.get("tenant", "")), int(prompt))
    except (OverflowError, TypeError, ValueError):  # not token ids
        return None


class DiskIndex:
    """Name -> the tokens a disk entry covers, of every tenant; looked up per tenant."""

    def __init__(self, cuts: CacheCuts = CacheCuts(), min_gain: int = MIN_RESTORE_TOKENS) -> None:
        self.cuts = cuts
        self.min_gain = min_gain
        self.entries: dict[str, DiskEntry] = {}
        self.stats = DiskStats()
        # set once rank 0's tier is open and its files read (scan_done): until then nothing is stored or restored
        self.enabled = False
        self._lock = threading.Lock()
        self._arrived: list[tuple[str, dict]] = []  # from the start-up scan, not yet taken

    def arrive(self, name: str, header: dict) -> None:
        """The start-up scan read one file's header (any thread)."""
        with self._lock:
            self._arrived.append((name, header))

    def scan_done(self) -> None:
        """The start-up scan has read every file: the tier is on (stores are named, lookups consider the disk)."""
        self.enabled = True

    def _take_arrived(self) -> None:
        with self._lock:
            arrived, self._arrived = self._arrived, []
        for name, header in arrived:
            entry = _entry(header)
            if entry is not None and name not in self.entries:
                self.entries[name] = entry

    def stored(self, name: str, tokens: list[int], tenant: str, prompt: int) -> None:
        self.entries[name] = DiskEntry(token_bytes(tokens), tenant, min(prompt, len(tokens)))

    def choose(self, tokens: list[int], tenant: str, ram: int) -> tuple[str, int, DiskEntry | None]:
        """(name, tokens it gives, entry) of tenant's disk entry worth restoring for a prompt the RAM tier gives
        `ram` tokens of; ("", 0, None) when none gives at least min_gain more. Like a RAM lookup, the prompt's last
        token is left to compute."""
        if not self.enabled:
            return "", 0, None
        self._take_arrived()
        key, limit = token_bytes(tokens), len(tokens) - 1
        best, best_len = "", 0
        for name, entry in self.entries.items():
            if entry.tenant != tenant:
                continue
            n = self.cuts.reusable(entry.length, min(common_prefix(entry.tokens, key), limit))
            if n > best_len:
                best, best_len = name, n
        if best_len < max(MIN_REUSE_TOKENS, ram + self.min_gain):
            return "", 0, None
        self.stats.hits += 1
        return best, best_len, self.entries[best]

    def supersede(self, tokens: list[int], tenant: str) -> list[str]:
        """Names of tenant's disk entries a new entry of `tokens` makes redundant (it can be cut, and it extends
        them: it serves every lookup they would); forgotten here, for the plan to delete."""
        if not self.cuts.can_cut(len(tokens)):
            return []
        self._take_arrived()
        key = token_bytes(tokens)
        names = [n for n, e in self.entries.items() if e.tenant == tenant and e.tokens != key
                 and key.startswith(e.tokens)]
        self.forget(names)
        return names

    def forget(self, names: list[str]) -> None:
        for name in names:
            self.entries.pop(name, None)

    def restored(self, names: list[str], failed: list[str]) -> None:
        """A plan's restores were applied: `failed` of them could not be loaded on some rank; they are forgotten
        (a damaged file is deleted on the rank that found it; one missing stays missing)."""
        self.forget(failed)
        self.stats.restore_failures += len(failed)
        self.stats.restores += len(names) - len(failed)
