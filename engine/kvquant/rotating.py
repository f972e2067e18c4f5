"""Quantized sliding windows: mlx-lm's RotatingKVCache and BatchRotatingKVCache storing quantized tokens.

Each token's key (and value) head vector is stored as ONE uint32 row: mx.quantize's packed words, then its
scales and biases viewed as uint32 words. A row is then one array along the token axis, so mlx-lm's own window
code (the wrap, trims, left padding, rolls, filter, extend, extract, merge, masks) moves it unchanged; a fetch
splits the rows back into the (packed, scales, biases) triple that mlx-lm's quantized attention reads (`bits`).
Each chunk is packed before it lands, so a long prompt never holds its window in full precision.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchRotatingKVCache, RotatingKVCache

Layout = tuple  # (group_size, bits, key dim, value dim, dtype name): what a row unpacks with (copyable: no Dtype)


def pack(x: mx.array, group_size: int, bits: int) -> mx.array:
    """x (..., dim) as rows of uint32: packed words, then scales and biases (2 or 4 bytes each) as words."""
    words, scales, biases = mx.quantize(x, group_size=group_size, bits=bits)
    return mx.concatenate([words, mx.view(mx.concatenate([scales, biases], axis=-1), mx.uint32)], axis=-1)


def unpack(rows: mx.array, dim: int, dtype, group_size: int, bits: int) -> tuple[mx.array, mx.array, mx.array]:
    """The (packed, scales, biases) triple of rows made by pack() from vectors of `dim` numbers of `dtype`."""
    n_words, groups = dim * bits // 32, dim // group_size
    rest = mx.view(rows[..., n_words:], dtype)
    return rows[..., :n_words], rest[..., :groups], rest[..., groups:]


class _Packed:
    """What both window kinds share: packing on store, unpacking on fetch, the layout that travels with them."""

    group_size: int
    kv_bits: int
    layout: Layout | None  # None until the first tokens tell the dims and dtype
    _window: type  # mlx-lm's window class whose code moves the rows

    def update_and_fetch(self, keys, values):
        return self._unpack(*self._window.update_and_fetch(self, *self._pack(keys, values)))

    @property
    def state(self):  # the layout travels with the rows (from_state builds a cache without __init__)
        return (*self._window.state.fget(self), self.group_size, self.kv_bits, self.layout)

    @state.setter
    def state(self, v):
        self._window.state.fset(self, v[:-3])
        self.group_size, self.kv_bits, self.layout = v[-3:]

    @property
    def bits(self) -> int:  # mlx-lm's scaled_dot_product_attention goes quantized on a cache with `bits`
        return self.kv_bits

    def _pack(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        if self.layout is None:
            self.layout = (self.group_size, self.kv_bits, keys.shape[-1], values.shape[-1],
                           str(keys.dtype).rsplit(".", 1)[-1])
        return pack(keys, self.group_size, self.kv_bits), pack(values, self.group_size, self.kv_bits)

    def _unpack(self, k_rows: mx.array, v_rows: mx.array):
        group, bits, k_dim, v_dim, name = self.layout
        dtype = getattr(mx, name)
        return unpack(k_rows, k_dim, dtype, group, bits), unpack(v_rows, v_dim, dtype, group, bits)

    def _take(self, other: Any) -> None:
        self.group_size, self.kv_bits, self.layout = other.group_size, other.kv_bits, other.layout


class QuantizedRotating(_Packed, RotatingKVCache):
    """One sequence's quantized sliding window (what make_prompt_cache gives, extract returns, the prefix cache
    stores)."""

    _window = RotatingKVCache

    def __init__(self, max_size: int, keep: int = 0, group_size: int = 64, bits: int = 8):
        super().__init__(max_size, keep)
        self.group_size, self.kv_bits, self.layout = group_size, bits, None

    @classmethod
    def merge(cls, caches: list[Any]) -> BatchQuantizedRotating:
        return BatchQuantizedRotating.merge(caches)


class BatchQuantizedRotating(_Packed, BatchRotatingKVCache):
    """A batch's quantized sliding windows: BatchRotatingKVCache's code on packed rows."""

    _window = BatchRotatingKVCache

    def __init__(self, max_size: int, left_padding: list[int], group_size: int = 64, bits: int = 8):
        super().__init__(max_size, left_padding)
        self.group_size, self.kv_bits, self.layout = group_size, bits, None

    def extend(self, other: BatchQuantizedRotating) -> None:
        if self.layout is None:
            self.layout = other.layout
        super().extend(other)

    def extract(self, idx: int) -> QuantizedRotating:
        row = super().extract(idx)
        out = QuantizedRotating(self.max_size, 0, self.group_size, self.kv_bits)
        RotatingKVCache.state.fset(out, RotatingKVCache.state.fget(row))
        out.layout = self.layout
        return out

    @classmethod
    def merge(cls, caches: list[Any]) -> BatchQuantizedRotating:
        if len({(c.group_size, c.kv_bits) for c in caches}) > 1:
            raise ValueError("a batch of quantized windows needs one group size and one number of bits")
        out = BatchRotatingKVCache.merge.__func__(cls, caches)
        known = next((c for c in caches if c.layout is not None), caches[0])
        out._take(known)
        return out
