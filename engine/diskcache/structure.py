"""A prefix-cache entry's per-layer caches as plain data (a msgpack-able tree) plus host arrays, and back.

Every cache kind the RAM tier keeps is an object whose instance attributes are arrays, tuples or lists of arrays
(some None), numbers, strings and caches nested inside (CacheList's caches, QuantizedLatent's inner QuantizedKV).
Walking those attributes, as engine/lockstep/prefix.py's compaction does, covers every kind with one rule, the
quantized ones included (their layout is ints and a dtype name), where each class's state/meta_state pair differs
(QuantizedLatent's state drops its offset). Restoring builds the object without __init__, as mlx-lm's from_state
does, from a fixed list of classes: a file never names code to run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import (ArraysCache, CacheList, ChunkedKVCache, ConcatenateKVCache, KVCache,
                                 QuantizedKVCache, RotatingKVCache)

from engine.kvquant.cache import QuantizedKV, QuantizedLatent
from engine.kvquant.rotating import QuantizedRotating
from engine.speculative.carry import HiddenCarry

# the single-sequence kinds an entry holds (a batch's kinds never reach the prefix cache); SPECULATIVE=mtp's
# HiddenCarry is a kind of its own, so an entry made with the heads never fits a model served without them
CLASSES = {c.__name__: c for c in (KVCache, RotatingKVCache, ArraysCache, CacheList, ChunkedKVCache,
                                   ConcatenateKVCache, QuantizedKVCache, QuantizedKV, QuantizedLatent,
                                   QuantizedRotating, HiddenCarry)}
# every MLX dtype, by the name its str() ends in ("bool" is mx.bool_)
DTYPES = {str(d).rsplit(".", 1)[-1]: d for d in (
    mx.bool_, mx.uint8, mx.uint16, mx.uint32, mx.uint64, mx.int8, mx.int16, mx.int32, mx.int64, mx.float16,
    mx.float32, mx.float64, mx.bfloat16, mx.complex64)}


class Unsupported(Exception):
    """The entry holds something the disk tier cannot write (a cache kind or attribute it does not know)."""


@dataclass
class HostEntry:
    """One entry's caches on the host: the structure (plain data) and each array's raw bytes (numpy uint8, any
    dtype's: bfloat16 has no numpy dtype) with its MLX dtype and shape. No MLX."""

    layers: list[Any]
    arrays: list[np.ndarray] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)


def _dtype_name(a: mx.array) -> str:
    return str(a.dtype).rsplit(".", 1)[-1]


def writable_bytes(a: mx.array) -> memoryview:
    """An evaluated, contiguous array's memory as bytes. MLX documents that a NumPy view of an array writes
    through to it (its buffer protocol): restoring reads a file straight into arrays made for it, no copy."""
    return memoryview(a).cast("B")


def empty(dtype: str, shape: list[int]) -> mx.array:
    """A new array of its own buffer, to be filled through writable_bytes once evaluated; raises Unsupported for
    a dtype MLX does not have."""
    if dtype not in DTYPES:
        raise Unsupported(f"no dtype {dtype!r} in MLX")
    return mx.zeros(shape, DTYPES[dtype])


def host_copy(layers: list[Any], copy: bool = True) -> HostEntry:
    """The entry's caches on the host, for a thread without MLX to write; run it where MLX runs (the step thread).

    copy: a memcpy per array (the cost is mostly the new pages' first touch: bench/disk_tier.py). Without it,
    numpy views of the arrays' own memory, which keep the arrays alive until the entry is dropped: no cost on the
    step thread, and safe because an array another holds is never written in place (MLX donates a buffer only
    from its last holder)."""
    out = HostEntry(layers=[])
    found: list[mx.array] = []
    out.layers = [_encode(c, out, found) for c in layers]
    found = [mx.contiguous(a) for a in found]  # a slice or a broadcast kept in a cache: its own bytes, in order
    mx.eval(found)
    for a in found:
        view = np.frombuffer(writable_bytes(a), np.uint8) if a.size else np.empty(0, np.uint8)
        out.arrays.append(view.copy() if copy else view)
    return out


def _encode(value: Any, out: HostEntry, found: list[mx.array]) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, mx.array):
        found.append(value)
        out.dtypes.append(_dtype_name(value))
        out.shapes.append(list(value.shape))
        return {"a": len(found) - 1}
    if isinstance(value, tuple):
        return {"t": [_encode(v, out, found) for v in value]}
    if isinstance(value, list):
        return [_encode(v, out, found) for v in value]
    kind = type(value).__name__
    if CLASSES.get(kind) is type(value):
        return {"c": kind, "v": {k: _encode(v, out, found) for k, v in vars(value).items()}}
    raise Unsupported(f"a {kind} cannot be written to disk")


def kinds(layers: list[Any]) -> list[Any]:
    """Each layer's cache class name (a CacheList's as [name, inner kinds]): a restored entry fits a model whose
    fresh cache (mlx-lm's make_prompt_cache) has the same kinds."""
    return [[type(c).__name__, kinds(c.caches)] if isinstance(c, CacheList) else type(c).__name__ for c in layers]


def restore(layers: list[Any], arrays: list[mx.array]) -> list[Any]:
    """The caches a structure describes, made of arrays (filled, in the structure's order); raises Unsupported
    on a structure this code did not write."""
    return [_decode(c, arrays) for c in layers]


def from_host(entry: HostEntry) -> list[Any]:
    """The caches of a host copy (an entry still waiting for the writer)."""
    made = [empty(d, s) for d, s in zip(entry.dtypes, entry.shapes)]
    mx.eval(made)
    for a, host in zip(made, entry.arrays):
        if host.nbytes:
            np.frombuffer(writable_bytes(a), np.uint8)[:] = host
    return restore(entry.layers, made)


def _decode(value: Any, arrays: list[mx.array]) -> Any:
    if isinstance(value, list):
        return [_decode(v, arrays) for v in value]
    if not isinstance(value, dict):
        return value
    try:
        if "a" in value:
            return arrays[value["a"]]
        if "t" in value:
            return tuple(_decode(v, arrays) for v in value["t"])
        cls = CLASSES[value["c"]]
        obj = cls.__new__(cls)
        for k, v in value["v"].items():
            setattr(obj, k, _decode(v, arrays))
        return obj
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise Unsupported(f"an unknown structure in the file: {exc!r}") from exc
