"""Quantized KV caches for a running batch: mlx-lm's BatchKVCache contract in QuantizedKVCache's layout.

Keys and values are stored as mx.quantize gives them, a tuple (packed uint32, scales, biases) per tensor, each
group of `group_size` numbers of a token's head vector quantized on its own. Every batch operation (left padding,
rolls, filters, merges, trims) moves whole token positions, so it applies to the three arrays alike and a row of
the batch holds exactly what mlx-lm's QuantizedKVCache holds for that sequence alone. Each chunk is quantized as
it lands, so a long prefill never holds its whole prompt's KV in full precision.

BatchQuantizedKVCache exposes `bits` and `group_size`: mlx-lm's base.scaled_dot_product_attention then takes its
quantized path (quantized_matmul on the packed keys and values). A model whose attention reads the fetched keys
itself (MLA's latent, DeepSeek and Kimi) gets BatchQuantizedLatentCache instead: the same storage, dequantized on
fetch, so storage drops and the transient float copy is one layer's.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import QuantizedKVCache, _BaseCache, dynamic_roll

Quantized = tuple  # (packed, scales, biases)


def _map(fn, q: Quantized | None) -> Quantized | None:
    return None if q is None else tuple(fn(a) for a in q)


def _nbytes(*qs: Quantized | None) -> int:
    return sum(a.nbytes for q in qs if q is not None for a in q)


class QuantizedKV(QuantizedKVCache):
    """One sequence's quantized KV (mlx-lm's QuantizedKVCache) that a batch can take back: extract() gives it,
    merge() builds the batch from it, the prefix cache stores it."""

    def size(self) -> int:
        return self.offset

    @property
    def nbytes(self) -> int:
        return _nbytes(self.keys, self.values)  # 0 when empty (mlx-lm's raises on an empty cache)

    def head(self, length: int) -> QuantizedKV:
        """A new cache of the first `length` tokens, in buffers of their own (the prefix cache's copies)."""
        out = QuantizedKV(self.group_size, self.bits)
        if self.keys is not None:
            out.keys, out.values = (_map(lambda a: mx.contiguous(a[..., :length, :]), q)
                                    for q in (self.keys, self.values))
            out.offset = length
        return out

    @classmethod
    def merge(cls, caches: list[Any]) -> BatchQuantizedKVCache:
        return BatchQuantizedKVCache.merge(caches)


def _inner(name: str) -> property:
    """An attribute read from and written to the wrapped cache."""
    return property(lambda self: getattr(self.inner, name), lambda self, v: setattr(self.inner, name, v))


class QuantizedLatent(_BaseCache):
    """One sequence's quantized MLA latent: QuantizedKV's storage, fetched dequantized (no `bits`: the model's
    attention reads the latent as floats)."""

    def __init__(self, group_size: int = 64, bits: int = 8):
        self.inner = QuantizedKV(group_size=group_size, bits=bits)

    # keys and values as a pipeline stage's forward pass reaches them (mx.depends on the last layer's keys)
    keys = _inner("keys")
    values = _inner("values")
    step = _inner("step")

    @property
    def offset(self) -> int:
        return self.inner.offset

    @property
    def group_size(self) -> int:
        return self.inner.group_size

    @property
    def kv_bits(self) -> int:
        return self.inner.bits

    def update_and_fetch(self, keys, values):
        k, v = self.inner.update_and_fetch(keys, values)
        return (mx.dequantize(*k, group_size=self.group_size, bits=self.kv_bits),
                mx.dequantize(*v, group_size=self.group_size, bits=self.kv_bits))

    @property
    def state(self):
        return self.inner.state

    @state.setter
    def state(self, v):
        self.inner = QuantizedKV()
        self.inner.state = v

    def size(self) -> int:
        return self.inner.offset

    def head(self, length: int) -> QuantizedLatent:
        out = QuantizedLatent(self.group_size, self.kv_bits)
        out.inner = self.inner.head(length)
        return out

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        return self.inner.trim(n)

    def make_mask(self, *args, **kwargs):
        return self.inner.make_mask(*args, **kwargs)

    def empty(self) -> bool:
        return self.inner.empty()

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes

    @classmethod
    def merge(cls, caches: list[Any]) -> BatchQuantizedLatentCache:
        return BatchQuantizedLatentCache.merge([c.inner for c in caches])


class _QuantizedRows(_BaseCache):
    """The storage and every batch operation; subclasses say how a fetch hands the KV to attention."""

    step = 256

    def __init__(self, left_padding: list[int], group_size: int = 64, bits: int = 8):
        self.keys: Quantized | None = None
        self.values: Quantized | None = None
        self.left_padding = mx.array(left_padding)
        self.offset = mx.array([-p for p in left_padding])
        self._idx = 0
        self._right_padding = None
        self.group_size = group_size
        self.kv_bits = bits

    # -- storing -------------------------------------------------------------------------------------------
    def _zeros(self, rows: int, heads: int, length: int, dim: int, dtype) -> Quantized:
        per_word = 32 // self.kv_bits
        shape = (rows, heads, length)
        return (mx.zeros((*shape, dim // per_word), mx.uint32), mx.zeros((*shape, dim // self.group_size), dtype),
                mx.zeros((*shape, dim // self.group_size), dtype))

    def _quantize(self, x: mx.array) -> Quantized:
        return tuple(mx.quantize(x, group_size=self.group_size, bits=self.kv_bits))

    def store(self, keys: mx.array, values: mx.array) -> tuple[Quantized, Quantized]:
        """Quantize the chunk into the rows' next positions; the stored keys and values up to them."""
        prev, n = self._idx, keys.shape[2]
        if self.keys is None or prev + n > self.keys[0].shape[2]:
            rows, heads = keys.shape[:2]
            length = (self.step + n - 1) // self.step * self.step
            new_k = self._zeros(rows, heads, length, keys.shape[3], keys.dtype)
            new_v = self._zeros(rows, heads, length, values.shape[3], values.dtype)
            if self.keys is None:
                self.keys, self.values = new_k, new_v
            else:
                if prev % self.step != 0:
                    self.keys, self.values = (_map(lambda a: a[..., :prev, :], q) for q in (self.keys, self.values))
                self.keys = tuple(mx.concatenate([a, b], axis=2) for a, b in zip(self.keys, new_k))
                self.values = tuple(mx.concatenate([a, b], axis=2) for a, b in zip(self.values, new_v))
        self.offset = self.offset + n
        self._idx += n
        for stored, chunk in ((self.keys, self._quantize(keys)), (self.values, self._quantize(values))):
            for a, b in zip(stored, chunk):
                a[..., prev:self._idx, :] = b
        return self.keys_and_values()

    def keys_and_values(self) -> tuple[Quantized, Quantized]:
        return tuple(_map(lambda a: a[..., :self._idx, :], q) for q in (self.keys, self.values))

    # -- what BatchGenerator asks of a batch cache -------------------------------------------------------------
    def prepare(self, *, left_padding=None, lengths=None, right_padding=None):
        if left_padding is not None:
            if self.keys is not None:
                raise ValueError("Left padding can only be added to an empty batch cache")
            left_padding = mx.array(left_padding)
            self.left_padding = self.left_padding + left_padding
            self.offset = self.offset - left_padding
        if right_padding is not None and max(right_padding) > 0:
            self._right_padding = mx.array(right_padding)

    def finalize(self):
        if self._right_padding is not None:
            self.roll(self._right_padding)
            self._right_padding = None

    def roll(self, shifts: mx.array) -> None:
        """Move row i's tokens right by shifts[i]; what wraps to its front becomes (masked) padding."""
        if self.keys is not None:
            self.keys, self.values = (_map(lambda a: dynamic_roll(a, shifts[:, None], axis=2), q)
                                      for q in (self.keys, self.values))
        self.left_padding = self.left_padding + shifts
        self.offset = self.offset - shifts

    def drop_front(self, n: int) -> None:
        """Cut the first n positions, padding in every row."""
        if n <= 0:
            return
        if self.keys is not None:
            self.keys, self.values = (_map(lambda a: a[..., n:, :], q) for q in (self.keys, self.values))
        self._idx -= n
        self.left_padding = self.left_padding - n

    @property
    def state(self):
        return self.keys, self.values, self.offset, self.left_padding, self._idx

    @state.setter
    def state(self, v):
        self.keys, self.values, self.offset, self.left_padding, self._idx = v

    @property
    def meta_state(self):
        return tuple(map(str, (self.group_size, self.kv_bits)))

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self._idx, n)
        self._idx -= n
        self.offset = self.offset - n
        return n

    def make_mask(self, N: int, return_array: bool = False, **kwargs):
        return create_causal_mask(N, offset=self._idx, left_padding=self.left_padding, **kwargs)

    def filter(self, batch_indices) -> None:
        if self.keys is not None:
            self.keys, self.values = (_map(lambda a: a[batch_indices], q) for q in (self.keys, self.values))
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        self.drop_front(min(self.left_padding.tolist()))  # the padding every remaining row starts with

    def extend(self, other: _QuantizedRows) -> None:
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        idx = max(self._idx, other._idx)
        size = max(c.keys[0].shape[2] for c in (self, other) if c.keys is not None)
        like = self if self.keys is not None else other

        def right_justified(c: _QuantizedRows) -> tuple[Quantized, Quantized]:
            if c.keys is None:
                rows = c.offset.shape[0]
                k, v = (_map(lambda a: mx.zeros((rows, *a.shape[1:2], 0, a.shape[3]), a.dtype), q)
                        for q in (like.keys, like.values))
            else:
                k, v = c.keys, c.values
            left = idx - c._idx
            right = size - k[0].shape[2] - left
            if right < 0:
                k, v = (_map(lambda a: a[..., :right, :], q) for q in (k, v))
                right = 0
            if left or right:
                pad = [(0, 0), (0, 0), (left, right), (0, 0)]
                k, v = (_map(lambda a: mx.pad(a, pad), q) for q in (k, v))
            return k, v

        (ka, va), (kb, vb) = right_justified(self), right_justified(other)
        self.keys = tuple(mx.concatenate(pair) for pair in zip(ka, kb))
        self.values = tuple(mx.concatenate(pair) for pair in zip(va, vb))
        self.left_padding = mx.concatenate([self.left_padding + (idx - self._idx),
                                            other.left_padding + (idx - other._idx)])
        self.offset = mx.concatenate([self.offset, other.offset])
        self._idx = idx

    def _row(self, idx: int) -> QuantizedKVCache:
        """Row idx's tokens, in buffers of their own, as one sequence's QuantizedKVCache."""
        out = QuantizedKV(group_size=self.group_size, bits=self.kv_bits)
        pad = self.left_padding.tolist()[idx]
        if self.keys is not None:
            out.keys, out.values = (_map(lambda a: mx.contiguous(a[idx:idx + 1, :, pad:self._idx]), q)
                                    for q in (self.keys, self.values))
            out.offset = self._idx - pad
        return out

    @classmethod
    def _merged(cls, caches: list[QuantizedKVCache]) -> _QuantizedRows:
        """The batch of these sequences' caches, each right-aligned (mlx-lm's QuantizedKVCache or QuantizedKV)."""
        first = caches[0]
        lengths = [c.offset if c.keys is not None else 0 for c in caches]
        longest = max(lengths)
        padding = [longest - n for n in lengths]
        out = cls(padding if longest else [0] * len(caches), first.group_size, first.bits)
        if not longest:
            return out
        full = next(c for c in caches if c.keys is not None)
        heads, dtype = full.keys[0].shape[1], full.keys[1].dtype
        k_dim = full.keys[1].shape[3] * first.group_size
        v_dim = full.values[1].shape[3] * first.group_size
        out.keys = out._zeros(len(caches), heads, longest, k_dim, dtype)
        out.values = out._zeros(len(caches), heads, longest, v_dim, dtype)
        for i, (p, c) in enumerate(zip(padding, caches)):
            if c.keys is None:
                continue
            for stored, own in ((out.keys, c.keys), (out.values, c.values)):
                for a, b in zip(stored, own):
                    a[i:i + 1, :, p:p + c.offset] = b[..., :c.offset, :]
        out.offset = out.offset + longest
        out._idx = longest
        return out

    def size(self) -> int:
        return self._idx

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        return _nbytes(self.keys, self.values)


class BatchQuantizedKVCache(_QuantizedRows):
    """A batch's quantized KV, fetched quantized: attention runs mlx-lm's quantized SDPA on it."""

    @property
    def bits(self) -> int:
        return self.kv_bits

    def update_and_fetch(self, keys, values):
        return self.store(keys, values)

    def extract(self, idx: int) -> QuantizedKV:
        return self._row(idx)

    @classmethod
    def merge(cls, caches: list[QuantizedKVCache]) -> BatchQuantizedKVCache:
        return cls._merged(caches)


class BatchQuantizedLatentCache(_QuantizedRows):
    """A batch's quantized MLA latent, fetched dequantized: attention sees floats, storage stays quantized."""

    def update_and_fetch(self, keys, values):
        k, v = self.store(keys, values)
        return (mx.dequantize(*k, group_size=self.group_size, bits=self.kv_bits),
                mx.dequantize(*v, group_size=self.group_size, bits=self.kv_bits))

    def extract(self, idx: int) -> QuantizedLatent:
        out = QuantizedLatent(self.group_size, self.kv_bits)
        out.inner = self._row(idx)
        return out

    @classmethod
    def merge(cls, caches: list[QuantizedKVCache]) -> BatchQuantizedLatentCache:
        return cls._merged(caches)
