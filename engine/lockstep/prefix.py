"""Every rank's shard of the prefix cache: KV entries by id, stored, copied and evicted only as plans say.

Rank 0 alone decides (engine/rank0/prefix_index.py holds the tokens of each entry); every rank holds
its own shard of the same entries under the same ids, and the batch fingerprint covers the ids, so a
rank whose entries differ fails fast like any other desync.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import CacheList, KVCache, can_trim_prompt_cache, trim_prompt_cache

log = logging.getLogger(__name__)


def cache_length(cache: list[Any]) -> int:
    """Tokens of KV a per-layer cache holds."""
    return int(cache[0].offset) if cache else 0


def cache_nbytes(cache: list[Any]) -> int:
    return int(sum(c.nbytes for c in cache))


def _first_tokens(cache: KVCache, length: int) -> KVCache:
    """A new KVCache holding the first `length` tokens of cache. MLX arrays are values: the slices are new
    arrays, and extending the copy never writes into the entry's buffers (the batch merges it into its own)."""
    out = KVCache()
    out.keys = cache.keys[..., :length, :]
    out.values = cache.values[..., :length, :]
    out.offset = length
    return out


def _own_arrays(layer: Any) -> list[mx.array]:
    """Give a layer cache's arrays buffers of their own, returning them (to evaluate together).

    A cache extracted from the batch holds lazy slices of the whole batch's buffer: kept as they are, one
    entry pins every row's KV while counting only its own. mx.contiguous copies a view into a buffer of its
    exact size once evaluated (a whole buffer stays as it is)."""
    if isinstance(layer, CacheList):  # a layer made of caches
        return [a for inner in layer.caches for a in _own_arrays(inner)]
    out = []
    for name, value in vars(layer).items():
        if isinstance(value, mx.array):
            value = mx.contiguous(value)
            out.append(value)
        elif isinstance(value, list | tuple) and value and all(isinstance(v, mx.array | None) for v in value):
            value = type(value)(None if v is None else mx.contiguous(v) for v in value)
            out.extend(v for v in value if v is not None)
        else:
            continue
        setattr(layer, name, value)
    return out


def compact(cache: list[Any], length: int) -> list[Any]:
    """The first `length` tokens of a per-layer cache, in evaluated buffers holding exactly what nbytes counts.

    A plain KVCache keeps only those tokens (its buffer grows in steps of 256 and a trim only moves the offset);
    the caller has already trimmed other kinds."""
    cache = [_first_tokens(c, length) if type(c) is KVCache and c.keys is not None else c for c in cache]
    arrays = [a for layer in cache for a in _own_arrays(layer)]
    mx.eval(arrays)
    return cache


class PrefixEntries:
    """The KV of stored sequences, by entry id (the same ids and lengths on every rank)."""

    def __init__(self) -> None:
        self.entries: dict[int, list[Any]] = {}

    def ids(self) -> list[int]:
        return list(self.entries)

    def nbytes(self) -> int:
        return sum(cache_nbytes(c) for c in self.entries.values())

    def sizes(self) -> dict[int, int]:
        return {i: cache_nbytes(c) for i, c in self.entries.items()}

    def put(self, entry: int, cache: list[Any] | None, length: int) -> None:
        """Keep the first `length` tokens of cache as entry; a cache that is shorter or cannot be trimmed is
        dropped (identically on every rank: all ranks hold the same lengths)."""
        if not cache or length <= 0:
            return
        have = cache_length(cache)
        if have < length or (have > length and not can_trim_prompt_cache(cache)):
            log.debug("prefix entry %d not kept: %d tokens of KV, %d wanted", entry, have, length)
            return
        if have > length:
            trim_prompt_cache(cache, have - length)
        self.entries[entry] = compact(cache, length)

    def take(self, entry: int, length: int) -> list[Any]:
        """A private copy of the entry's first `length` tokens, for a new sequence to extend. Plain KV caches
        copy only those tokens (reusing a short prefix of a long conversation costs the prefix, not the
        conversation); other kinds are copied whole and trimmed."""
        held = self.entries[entry]
        if all(type(c) is KVCache and c.keys is not None for c in held):
            return [_first_tokens(c, length) for c in held]
        cache = copy.deepcopy(held)
        extra = cache_length(cache) - length
        if extra > 0:
            trim_prompt_cache(cache, extra)
        return cache

    def evict(self, ids: list[int]) -> None:
        for i in ids:
            self.entries.pop(i, None)

    def clear(self) -> None:
        self.entries.clear()
