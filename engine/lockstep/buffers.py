"""How many arrays (Metal buffers) caches hold: Metal caps the live buffers of a process (about 499,000), so many
short prefix-cache entries can end a rank long before their bytes would.

Each cache kind is asked (its `state`: keys and values; a quantized cache's scales and biases; an ArraysCache's
states; a batch cache's offsets and padding), never assumed to hold two arrays per layer.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import CacheList


def _count(value: Any) -> int:
    if isinstance(value, mx.array):
        return 1
    if isinstance(value, list | tuple):
        return sum(_count(v) for v in value)
    return 0


def layer_arrays(layer: Any) -> int:
    """The arrays one layer's cache holds (those of the caches inside a CacheList included)."""
    if isinstance(layer, CacheList):
        return sum(layer_arrays(c) for c in layer.caches)
    return 0 if layer.empty() else _count(layer.state)


def cache_arrays(cache: list[Any]) -> int:
    """The arrays a per-layer cache holds."""
    return sum(layer_arrays(c) for c in cache)
