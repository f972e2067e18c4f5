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

# the single-sequence kinds an entry holds (a batch's kinds never reach the prefix cache)
CLASSES = {c.__name__: c for c in (KVCache, RotatingKVCache, ArraysCache, CacheList, ChunkedKVCache,
                                   ConcatenateKVCache, QuantizedKVCache, QuantizedKV, QuantizedLatent,
                                   QuantizedRotating)}
# numpy has no bfloat16: its bytes travel as uint16 and are viewed back on restore
_CARRIERS = {"bfloat16": (mx.uint16, np.uint16)}


class Unsupported(Exception):
    """The entry holds something the disk tier cannot write (a cache kind or attribute it does not know)."""


@dataclass
class HostEntry:
    """One entry's caches on the host: the structure (plain data) and the arrays' bytes (numpy), no MLX."""

    layers: list[Any]
    arrays: list[np.ndarray] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)  # MLX's dtype name of each array

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)


def _dtype_name(a: mx.array) -> str:
    return str(a.dtype).rsplit(".", 1)[-1]


def host_copy(layers: list[Any]) -> HostEntry:
    """The entry's caches copied to the host (a memcpy per array; run it where MLX runs, the step thread)."""
    out = HostEntry(layers=[])
    out.layers = [_encode(c, out) for c in layers]
    return out


def _encode(value: Any, out: HostEntry) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, mx.array):
        name = _dtype_name(value)
        carrier = _CARRIERS.get(name)
        out.arrays.append(np.array(value.view(carrier[0]) if carrier else value))
        out.dtypes.append(name)
        return {"a": len(out.arrays) - 1}
    if isinstance(value, tuple):
        return {"t": [_encode(v, out) for v in value]}
    if isinstance(value, list):
        return [_encode(v, out) for v in value]
    kind = type(value).__name__
    if CLASSES.get(kind) is type(value):
        return {"c": kind, "v": {k: _encode(v, out) for k, v in vars(value).items()}}
    raise Unsupported(f"a {kind} cannot be written to disk")


def restore(layers: list[Any], arrays: list[np.ndarray], dtypes: list[str]) -> list[Any]:
    """The caches a structure and its host arrays describe, as MLX arrays; raises Unsupported on a structure this
    code did not write."""
    made = [_array(a, d) for a, d in zip(arrays, dtypes)]
    return [_decode(c, made) for c in layers]


def _array(a: np.ndarray, dtype: str) -> mx.array:
    carrier = _CARRIERS.get(dtype)
    out = mx.array(a)
    if carrier:
        return out.view(getattr(mx, dtype))
    if _dtype_name(out) != dtype:
        raise Unsupported(f"an array of {dtype} came back as {_dtype_name(out)}")
    return out


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
