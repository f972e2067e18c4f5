"""Every rank's shard of the prefix cache: per-layer caches by entry id, stored, copied and evicted only as plans say.

Rank 0 alone decides (engine/rank0/prefix_index.py holds the tokens of each entry); every rank holds
its own shard of the same entries under the same ids, and the batch fingerprint covers the ids, so a
rank whose entries differ fails fast like any other desync.

Lengths come from the tokens mlx-lm's BatchGenerator says a sequence has fed (the same on every rank), never
from one layer's cache: the layers of one model are of different kinds (engine/lockstep/cuts.py), and each is
asked what it can do.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import CacheList, KVCache, RotatingKVCache, _BaseCache, make_prompt_cache

from engine.kvquant.cache import QuantizedKV, QuantizedLatent
from engine.lockstep.buffers import cache_arrays
from engine.lockstep.cuts import CacheCuts

log = logging.getLogger(__name__)


def cache_nbytes(cache: list[Any]) -> int:
    return int(sum(c.nbytes for c in cache))


def _layers(cache: list[Any]) -> list[Any]:
    """Every layer cache, those inside a CacheList included."""
    out = []
    for c in cache:
        out.extend(_layers(c.caches) if isinstance(c, CacheList) else [c])
    return out


def model_cuts(model: Any) -> CacheCuts:
    """What the model's cache kinds allow: built from a fresh cache of its own, as the batch builds one."""
    layers = _layers(make_prompt_cache(model))
    windows = [c.max_size for c in layers if isinstance(c, RotatingKVCache)]
    # a fresh cache of any other kind that says it cannot be trimmed never can (ArraysCache: a running state)
    whole_only = any(not c.is_trimmable() for c in layers if not isinstance(c, RotatingKVCache))
    return CacheCuts(whole_only=whole_only, window=min(windows, default=0))


_QUANTIZED = (QuantizedKV, QuantizedLatent)  # engine/kvquant's per-sequence caches: head(n) copies n tokens


def _first_tokens(cache: KVCache, length: int) -> KVCache:
    """A new KVCache holding the first `length` tokens of cache. MLX arrays are values: the slices are new
    arrays, and extending the copy never writes into the entry's buffers (the batch merges it into its own)."""
    out = KVCache()
    out.keys = cache.keys[..., :length, :]
    out.values = cache.values[..., :length, :]
    out.offset = length
    return out


def _unwrapped_window(cache: RotatingKVCache) -> RotatingKVCache:
    """A sliding-window cache that has not wrapped, without the slots past its tokens (a trim leaves them)."""
    if cache.keys is not None and cache.offset < cache.max_size and cache._idx == cache.offset:
        cache.keys = cache.keys[..., :cache.offset, :]
        cache.values = cache.values[..., :cache.offset, :]
    return cache


def _own_arrays(layer: Any) -> list[mx.array]:
    """Give a layer cache's arrays buffers of their own, returning them (to evaluate together).

    A cache extracted from the batch holds lazy slices of the whole batch's buffer: kept as they are, one
    entry pins every row's KV while counting only its own. mx.contiguous copies a view into a buffer of its
    exact size once evaluated (a whole buffer stays as it is)."""
    if isinstance(layer, CacheList):  # a layer made of caches
        return [a for inner in layer.caches for a in _own_arrays(inner)]
    out = []
    for name, value in vars(layer).items():
        if isinstance(value, _BaseCache):  # a cache kept inside another (engine/kvquant's latent)
            out.extend(_own_arrays(value))
            continue
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
    """A per-layer cache of `length` tokens, in evaluated buffers holding exactly what nbytes counts.

    A plain KVCache keeps only those tokens (its buffer grows in steps of 256 and a trim only moves the
    offset), and so does a quantized one (KV_BITS: the entry stays in the batch's precision); a sliding window
    that has not wrapped only its slots in use; other kinds hold what they hold."""
    def tight(c: Any) -> Any:
        if type(c) is KVCache and c.keys is not None:
            return _first_tokens(c, length)
        if type(c) in _QUANTIZED:
            return c.head(length)
        return _unwrapped_window(c) if isinstance(c, RotatingKVCache) else c  # KV_BITS's packed windows too
    cache = [tight(c) for c in cache]
    arrays = [a for layer in cache for a in _own_arrays(layer)]
    mx.eval(arrays)
    return cache


def _copy_layer(layer: Any, have: int, length: int) -> Any:
    """A private copy of one layer's first `length` of its `have` tokens."""
    if type(layer) is KVCache and layer.keys is not None:
        return _first_tokens(layer, length)  # only the tokens taken, not the whole entry
    if type(layer) in _QUANTIZED:
        return layer.head(length)
    out = copy.deepcopy(layer)
    if length < have:
        if not out.is_trimmable():  # rank 0 never plans this (engine/lockstep/cuts.py)
            raise RuntimeError(f"a {type(layer).__name__} of {have} tokens cannot be cut to {length}")
        out.trim(have - length)
    return out


class PrefixEntries:
    """The caches of stored sequences, by entry id (the same ids and lengths on every rank)."""

    def __init__(self, cuts: CacheCuts = CacheCuts()) -> None:
        self.cuts = cuts  # what rank 0's index is told the entries allow
        self.entries: dict[int, list[Any]] = {}
        self.lengths: dict[int, int] = {}  # tokens each entry covers
        self.arrays: dict[int, int] = {}  # arrays (Metal buffers) each entry holds (engine/lockstep/buffers.py)

    def ids(self) -> list[int]:
        return list(self.entries)

    def nbytes(self) -> int:
        return sum(cache_nbytes(c) for c in self.entries.values())

    def sizes(self) -> dict[int, int]:
        return {i: cache_nbytes(c) for i, c in self.entries.items()}

    def put(self, entry: int, cache: list[Any] | None, length: int, have: int) -> None:
        """Keep the first `length` of the `have` tokens cache holds as entry. One that holds fewer, or more and
        cannot be cut, is dropped: identically on every rank, since every rank has fed the same tokens and
        follows the same rule (self.cuts: under pipeline parallel this rank's own layers may allow more than
        another's); rank 0 then forgets the entry."""
        if not cache or length <= 0:
            return
        cuttable = self.cuts.can_cut(have) and all(c.is_trimmable() for c in _layers(cache))
        if have < length or (have > length and not cuttable):
            log.debug("prefix entry %d not kept: %d tokens fed, %d wanted", entry, have, length)
            return
        if have > length:
            for c in _layers(cache):
                c.trim(have - length)
        self.entries[entry] = compact(cache, length)
        self.lengths[entry] = length
        self.arrays[entry] = cache_arrays(self.entries[entry])

    def take(self, entry: int, length: int) -> list[Any]:
        """A private copy of the entry's first `length` tokens, for a new sequence to extend: plain KV caches
        copy only those tokens (reusing a short prefix of a long conversation costs the prefix, not the
        conversation), other kinds are copied whole and cut where they can be."""
        have = self.lengths[entry]
        return [_copy_layer(c, have, length) for c in self.entries[entry]]

    def evict(self, ids: list[int]) -> None:
        for i in ids:
            self.entries.pop(i, None)
            self.lengths.pop(i, None)
            self.arrays.pop(i, None)

    def clear(self) -> None:
        self.entries.clear()
        self.lengths.clear()
        self.arrays.clear()
