"""Rank 0's side of the prefix cache: which token sequences every rank holds KV for, and which to reuse.

No MLX here (numpy compares token prefixes). Rank 0 alone looks up, stores and evicts; its decisions
travel in the plan (Insert.cache_id/cache_len, Plan.stores, Plan.evicts) and every rank's PrefixEntries
obeys them.
The budget is in bytes, measured on rank 0's own shard after each store (every rank holds an equal
shard of the same entries), and the least recently used entries go first.
What an entry can give depends on the model's cache kinds (CacheCuts, learnt at load): one that cannot be cut
serves only prompts that extend it exactly.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.lockstep.cuts import CacheCuts
from engine.rank0.kv_budget import memory_left

# Shorter prefixes are neither reused nor stored. Reusing costs a copy of the tokens reused
# (engine/lockstep/prefix.py), far less than computing them, so even a chat template's first few tokens
# pay; below this, the entries would only crowd the index.
MIN_REUSE_TOKENS = 4
_WIDTH = array("I").itemsize
# A waiting prompt that shares this many more tokens with a prompt being prefilled than with any entry
# waits for that prefill and starts from its KV, instead of computing the same tokens alongside it.
SHARE_MIN_TOKENS = 256
# A sequence removed mid-prefill (its client gone or timed out) keeps the prompt tokens it fed as an entry only
# where they are this many past what it reused: a retry computes fewer in well under a second even on a large
# model, and such an entry would only take budget (on a model whose entries cannot be cut, a whole state) from others.
PARTIAL_MIN_TOKENS = 256


def prompt_cache_budget(setting: int, ranks: Sequence[Any]) -> int:
    """PROMPT_CACHE_BYTES, or for -1 a quarter of what the smallest rank has left after its weights, within
    what its GPU may wire (engine/rank0/kv_budget.py memory_left)."""
    if setting >= 0:
        return setting
    left = memory_left(ranks)
    return max(0, left // 4) if left is not None else 0


def prefix_info(index: PrefixIndex) -> dict[str, int]:
    """The Info fields of the prefix cache (read from the socket thread: plain ints, a stale value is harmless)."""
    st = index.stats
    return {"prompt_cache_budget": index.budget, "prompt_cache_bytes": index.held,
            "prompt_cache_entries": len(index.entries), "prompt_cache_hits": st.hits,
            "prompt_cache_misses": st.misses, "prompt_cache_evictions": st.evictions,
            "prompt_tokens_total": st.prompt_tokens, "prompt_tokens_cached": st.cached_tokens,
            "live_buffers": index.live_arrays, "live_buffers_budget": index.max_arrays}


def token_bytes(tokens: list[int]) -> bytes:
    """Tokens as fixed-width bytes: compact, and prefixes compare in C (bytes.startswith, numpy)."""
    return array("I", tokens).tobytes()


def common_prefix(a: bytes, b: bytes) -> int:
    """Tokens in the longest common prefix of two token_bytes."""
    n = min(len(a), len(b)) // _WIDTH
    if a[:n * _WIDTH] == b[:n * _WIDTH]:
        return n
    differ = np.frombuffer(a, np.uint32, n) != np.frombuffer(b, np.uint32, n)
    return int(np.argmax(differ))


@dataclass
class Entry:
    tokens: bytes  # token_bytes of the tokens its KV covers
    prompt: int = 0  # how many of them were the sequence's prompt (the rest it generated)
    tenant: str = ""  # only requests of the same tenant (Generate.cache_salt) reuse or supersede it
    shared: bool = False  # where several conversations part: none of them supersedes it by going on from it
    nbytes: int = 0  # known once the store has been applied
    arrays: int = 0  # arrays (Metal buffers) it holds, known with nbytes
    disk: str = ""  # its name in the disk tier, where it was written there (engine/rank0/disk_plan.py)

    @property
    def length(self) -> int:
        return len(self.tokens) // _WIDTH


@dataclass
class Partial:
    """An entry planned from a sequence removed mid-prefill: how many tokens every rank keeps is known once the plan
    is applied (Store.least), so it joins the index then."""

    tokens: list[int]  # the most it may cover (the prompt but its last token)
    least: int
    source: int
    reused: int
    tenant: str


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    stored: int = 0
    prompt_tokens: int = 0  # prompt tokens of every inserted sequence
    cached_tokens: int = 0  # of which came from an entry


class PrefixIndex:
    """Entry id -> the tokens its KV covers, in LRU order, within a byte budget."""

    def __init__(self, budget_bytes: int, cuts: CacheCuts = CacheCuts(), max_arrays: int = 0) -> None:
        self.budget = budget_bytes
        # Metal caps a process's live buffers: the batch's arrays and the entries' stay within this (0: no cap)
        self.max_arrays = max_arrays
        self.live_arrays = 0  # the batch's and the entries' arrays as of the last plan applied (read by other threads)
        self.cuts = cuts
        self.entries: OrderedDict[int, Entry] = OrderedDict()
        self.next_id = 1
        self.evicting: list[int] = []  # for the next plan
        self.stats = CacheStats()
        self.partial: dict[int, Partial] = {}  # entry id -> planned, until the plan is applied
        self.held = 0  # bytes of the entries as of the last plan applied (read by other threads)
        self.superseded: list[str] = []  # disk names of entries a longer one made redundant, for the next plan

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())

    def lookup(self, tokens: list[int], tenant: str = "") -> tuple[int, int]:
        """(entry id, tokens to reuse) for a new prompt of tenant's: the longest common prefix, leaving at least
        the last prompt token to compute (its logits start the generation); (0, 0) when nothing is worth reusing."""
        best, best_len = self.best(token_bytes(tokens), len(tokens) - 1, tenant)
        self.count(tokens)
        if best_len < MIN_REUSE_TOKENS:
            self.stats.misses += 1
            return 0, 0
        self.stats.hits += 1
        self.stats.cached_tokens += best_len
        self.entries.move_to_end(best)
        return best, best_len

    def unhit(self, looked_up: int, reused: int) -> None:
        """A lookup's promise of looked_up tokens gave only `reused` (the ranks no longer held the entry)."""
        self.stats.cached_tokens += reused - looked_up
        if looked_up and not reused:
            self.stats.hits -= 1
            self.stats.misses += 1

    def best(self, key: bytes, limit: int, tenant: str = "") -> tuple[int, int]:
        """(entry id, tokens it can give, at most limit) of tenant's entry giving the most to key; no stats."""
        best, best_len = 0, 0
        for entry_id, entry in self.entries.items():
            if entry.tenant != tenant:
                continue
            n = self.cuts.reusable(entry.length, min(common_prefix(entry.tokens, key), limit))
            if n > best_len:
                best, best_len = entry_id, n
        return best, best_len

    def count(self, tokens: list[int]) -> None:
        """A sequence joins the batch with this prompt (counted with the cache on or off)."""
        self.stats.prompt_tokens += len(tokens)

    def add(self, tokens: list[int], source: int = 0, reused: int = 0, prompt: int = -1,
            tenant: str = "", shared: bool = False, reserved: int = 0) -> int | None:
        """A new entry for a sequence's tokens (its KV stored by the next plan); None when not worth keeping.

        `prompt` of the tokens were the sequence's prompt (all of them by default). Entries whose tokens are a
        prefix of the new one are now redundant when it can be cut (it serves every lookup they would) and are
        evicted; one that cannot be cut leaves them, as an entry that cannot be cut covers no shorter one.
        So is the entry the sequence started from (source, of which it reused `reused` tokens) when the
        sequence really continues it: it holds that entry's whole prompt and parts only in what that entry
        generated (a conversation's next turn, whose last answer came back as text and tokenised
        differently). A sequence that parts earlier is a sibling (another conversation on the same system
        prompt, a regenerated answer): both stay, and LRU and the byte budget choose between them. Only the
        tenant's own entries are compared: another tenant's never make one redundant. `reserved`: the id reserve()
        gave an entry the ranks already hold."""
        if len(tokens) < MIN_REUSE_TOKENS:
            return None
        key = token_bytes(tokens)
        old = self.entries.get(source)
        if old is not None and old.tokens == key:  # the very same tokens again: the entry it came from serves
            self.entries.move_to_end(source)
            return None
        if old is not None and reused >= old.prompt and not old.shared:
            self._evict(source, superseded=True)
        cut = self.cuts.can_cut(len(tokens))
        for entry_id, entry in list(self.entries.items()):
            if entry.tenant != tenant:
                continue
            if key.startswith(entry.tokens) and cut:
                self._evict(entry_id, superseded=True)
            elif entry.tokens.startswith(key) and (entry.tokens == key or self.cuts.can_cut(entry.length)):
                self.entries.move_to_end(entry_id)
                return None  # an entry already covers it
        entry_id = reserved  # an id given out by reserve(), or a new one
        if not entry_id:
            entry_id = self.next_id
            self.next_id += 1
        self.entries[entry_id] = Entry(tokens=key, prompt=len(tokens) if prompt < 0 else min(prompt, len(tokens)),
                                       tenant=tenant, shared=shared)
        self.stats.stored += 1
        return entry_id

    def restored(self, tokens: bytes, tenant: str, prompt: int, disk: str) -> int:
        """A new entry for a disk entry the next plan restores (its bytes known once the plan is applied)."""
        entry_id = self.next_id
        self.next_id += 1
        self.entries[entry_id] = Entry(tokens=tokens, prompt=prompt, tenant=tenant, disk=disk)
        return entry_id

    def reserve(self, tokens: list[int], least: int, source: int = 0, reused: int = 0, tenant: str = "") -> int:
        """An entry id for the first `least` to len(tokens) tokens of a sequence removed mid-prefill (Store.least)."""
        entry_id = self.next_id
        self.next_id += 1
        self.partial[entry_id] = Partial(tokens, least, source, reused, tenant)
        return entry_id

    def applied(self, sizes: dict[int, int], in_use: set[int] = frozenset(), arrays: dict[int, int] | None = None,
                batch_arrays: int = 0, lengths: dict[int, int] | None = None) -> None:
        """After a plan: the bytes (and arrays) of each entry rank 0 holds, the tokens it covers (lengths: needed
        for the entries reserved mid-prefill), and the arrays its batch holds. Entries the ranks did not keep are
        forgotten; then the least recently used go until the rest fits the budget and, next to the batch,
        MAX_LIVE_BUFFERS (not those in_use by this plan)."""
        self._settle_partial(sizes, lengths or {})
        for entry_id in [i for i in self.entries if i not in sizes]:
            del self.entries[entry_id]
        for entry_id, nbytes in sizes.items():
            if entry_id in self.entries:
                self.entries[entry_id].nbytes = nbytes
                self.entries[entry_id].arrays = (arrays or {}).get(entry_id, 0)
        self.fit(self.budget, in_use, max(0, self.max_arrays - batch_arrays) if self.max_arrays else None)
        self.held = self.nbytes
        self.live_arrays = batch_arrays + sum(e.arrays for e in self.entries.values())

    def _settle_partial(self, sizes: dict[int, int], lengths: dict[int, int]) -> None:
        """The entries reserved mid-prefill join the index with the tokens every rank kept; one the index does not
        want (another entry covers it) is evicted from the ranks by the next plan."""
        partial, self.partial = self.partial, {}
        for entry_id, p in partial.items():
            n = lengths.get(entry_id, 0) if entry_id in sizes else 0
            if not n:
                continue  # it had fed too few: no rank kept it
            if self.add(p.tokens[:n], p.source, p.reused, tenant=p.tenant, reserved=entry_id) is None:
                self.evicting.append(entry_id)

    def fit(self, budget: int, in_use: set[int] = frozenset(), max_arrays: int | None = None) -> int:
        """Evict least recently used entries until they fit budget bytes (and max_arrays arrays, when given);
        the bytes freed."""
        freed = 0
        total = self.nbytes
        arrays = sum(e.arrays for e in self.entries.values())
        for entry_id in list(self.entries):
            if total <= budget and (max_arrays is None or arrays <= max_arrays):
                break
            if entry_id in in_use:
                continue
            entry = self.entries[entry_id]
            self._evict(entry_id)
            total -= entry.nbytes
            arrays -= entry.arrays
            freed += entry.nbytes
        return freed

    def _evict(self, entry_id: int, superseded: bool = False) -> None:
        """superseded: a longer entry serves what it did, so its disk copy goes too (the LRU's stay on disk)."""
        if superseded and self.entries[entry_id].disk:
            self.superseded.append(self.entries[entry_id].disk)
        del self.entries[entry_id]
        self.evicting.append(entry_id)
        self.stats.evictions += 1

    def take_evictions(self) -> list[int]:
        out, self.evicting = self.evicting, []
        return out
