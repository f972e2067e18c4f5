"""Rank 0's index of the prefix cache's disk tier: which token sequences the ranks' files hold, and which to restore.

No MLX here (token prefixes compare as bytes, engine/rank0/prefix_index.py). The index is rebuilt at start-up from
rank 0's own files, read by a background thread (`arrive`) while the tier is still off, so serving never waits for
the disk. Entries stored since join it at once. Only rank 0's files are read: a file another rank lacks or finds
damaged is caught when the restore is applied (engine/lockstep/disk.py), and computed.

The disk may hold thousands of entries (a RAM index holds tens), so a lookup does not compare the prompt with every
one: each entry is filed under chained digests of its first BLOCK tokens, 2 x BLOCK, ..., and a prompt's own chain
finds the entries sharing the most whole blocks with it, the only ones compared token by token.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field

from engine.lockstep.cuts import CacheCuts
from engine.rank0.prefix_index import _WIDTH, MIN_REUSE_TOKENS, common_prefix, token_bytes

log = logging.getLogger(__name__)

# A restore reads a whole entry's KV from disk; it is planned only where it gives this many more prompt tokens than
# the RAM tier: fewer are computed faster than a file is opened and checked.
MIN_RESTORE_TOKENS = 32
# Tokens per block of the lookup chain: a disk entry serves a prompt that shares at least its first BLOCK tokens,
# and is superseded on disk only by an entry extending it if it holds one whole block (shorter ones the tier's LRU
# drops in time).
BLOCK = 256
_BLOCK_BYTES = BLOCK * 4


@dataclass
class DiskEntry:
    tokens: bytes  # token_bytes of the tokens its KV covers
    tenant: str
    prompt: int  # how many of them were a prompt (the rest generated): see PrefixIndex.add
    chain: list[bytes] = field(default_factory=list)  # digests of its whole blocks, chained (chain())

    @property
    def length(self) -> int:
        return len(self.tokens) // 4


@dataclass
class DiskStats:
    hits: int = 0  # lookups that chose a disk entry (a restore planned)
    restores: int = 0  # restores every rank loaded
    restore_failures: int = 0  # restores some rank could not load (the prompt was computed)


def chain(tenant: str, key: bytes) -> list[bytes]:
    """Per whole block of key (token_bytes), a digest of the tenant and every token up to that block's end."""
    h = hashlib.blake2b(tenant.encode(), digest_size=16)
    out = []
    for end in range(_BLOCK_BYTES, len(key) + 1, _BLOCK_BYTES):
        h.update(key[end - _BLOCK_BYTES:end])
        out.append(h.copy().digest())
    return out


def _entry(header: dict) -> DiskEntry | None:
    """A file's header as an entry, or None where it lacks what rank 0 writes (tokens, an int length)."""
    key = header.get("tokens")  # token_bytes of the tokens (engine/rank0/disk_plan.py writes them packed)
    if not isinstance(key, bytes) or len(key) % _WIDTH:
        return None
    length = len(key) // _WIDTH
    if length != header.get("length") or length < MIN_REUSE_TOKENS:
        return None
    try:
        tenant = str(header.get("tenant", ""))
        return DiskEntry(key, tenant, int(header.get("prompt", length)), chain(tenant, key))
    except (TypeError, ValueError):  # a prompt length that is not a number
        return None


class DiskIndex:
    """Name -> the tokens a disk entry covers, of every tenant; looked up per tenant."""

    def __init__(self, cuts: CacheCuts = CacheCuts(), min_gain: int = MIN_RESTORE_TOKENS) -> None:
        self.cuts = cuts
        self.min_gain = min_gain
        self.entries: dict[str, DiskEntry] = {}
        self.blocks: dict[bytes, set[str]] = {}  # chain digest -> entries holding that block
        self.ends: dict[bytes, set[str]] = {}  # chain digest -> entries whose last whole block it is
        self.stats = DiskStats()
        # set once rank 0's tier is open and its files read (scan_done): until then the scheduler neither stores
        # nor looks up anything here, so the scan's thread alone fills the index
        self.enabled = False

    def arrive(self, name: str, header: dict) -> None:
        """The start-up scan read one file's header (its own thread, before scan_done)."""
        entry = _entry(header)
        if entry is not None:
            self._add(name, entry)

    def scan_done(self) -> None:
        """The start-up scan has read every file: the tier is on (stores are named, lookups consider the disk)."""
        self.enabled = True

    def _add(self, name: str, entry: DiskEntry) -> None:
        self.forget([name])
        self.entries[name] = entry
        for digest in entry.chain:
            self.blocks.setdefault(digest, set()).add(name)
        if entry.chain:
            self.ends.setdefault(entry.chain[-1], set()).add(name)

    def stored(self, name: str, tokens: list[int], tenant: str, prompt: int) -> None:
        key = token_bytes(tokens)
        self._add(name, DiskEntry(key, tenant, min(prompt, len(tokens)), chain(tenant, key)))

    def _sharing(self, key: bytes, tenant: str) -> tuple[set[str], int]:
        """tenant's entries sharing the most whole blocks with key (none: not one block), and how many blocks."""
        found: set[str] = set()
        depth = 0
        for digest in chain(tenant, key):
            names = self.blocks.get(digest)
            if not names:
                break
            found, depth = names, depth + 1
        return found, depth

    def choose(self, tokens: list[int], tenant: str, ram: int) -> tuple[str, int, DiskEntry | None]:
        """(name, tokens it gives, entry) of tenant's disk entry worth restoring for a prompt the RAM tier gives
        `ram` tokens of; ("", 0, None) when none gives at least min_gain more. Like a RAM lookup, the prompt's last
        token is left to compute."""
        if not self.enabled:
            return "", 0, None
        key, limit = token_bytes(tokens), len(tokens) - 1
        best, best_len = "", 0
        names, depth = self._sharing(key[:limit * 4], tenant)
        start, end = depth * _BLOCK_BYTES, (depth + 1) * _BLOCK_BYTES
        for name in names:  # they share `depth` blocks with the prompt, and none of them the next one whole
            entry = self.entries[name]
            shared = depth * BLOCK + common_prefix(entry.tokens[start:end], key[start:end])
            n = self.cuts.reusable(entry.length, min(shared, limit))
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
        key = token_bytes(tokens)
        candidates: set[str] = set()
        for digest in chain(tenant, key):  # an entry key extends ends its whole blocks somewhere in key's chain
            candidates |= self.ends.get(digest, set())
        names = [n for n in candidates if self.entries[n].tokens != key and key.startswith(self.entries[n].tokens)]
        self.forget(names)
        return names

    def forget(self, names: list[str]) -> None:
        for name in names:
            entry = self.entries.pop(name, None)
            if entry is None:
                continue
            for table, digests in ((self.blocks, entry.chain), (self.ends, entry.chain[-1:])):
                for digest in digests:
                    held = table.get(digest)
                    if held is not None:
                        held.discard(name)
                        if not held:
                            del table[digest]

    def restored(self, names: list[str], failed: list[str]) -> None:
        """A plan's restores were applied: `failed` of them could not be loaded on some rank; they are forgotten
        (a damaged file is deleted on the rank that found it; one missing stays missing)."""
        self.forget(failed)
        self.stats.restore_failures += len(failed)
        self.stats.restores += len(names) - len(failed)
