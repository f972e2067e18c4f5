"""Dropping each sequence's own number of last tokens from a batch's caches, and which cache kinds allow it.

mlx-lm's BatchKVCache keeps every sequence's tokens right-aligned at one write index `_idx`, each row's start
marked by its `left_padding` (masked) and its length by `offset` (which RoPE reads per row). After a step that fed
k + 1 tokens to every row, row i must forget its last n_i: trim the count all rows forget (the write index moves
back), then roll each row that forgets more right by its extra, so its last kept token sits just before the write
index again, and grow its left padding by as much (what rolls round to the row's front lies in the padding and is
masked); the padding every row then starts with is cut off, so the buffer stays as long as the longest row.
MLA's latent cache (DeepSeek V3) is a KVCache holding the latent and the rotary key, so the same holds. A quantized
batch cache (engine/kvquant: KV_BITS) holds each of keys and values as three arrays (packed, scales, biases) laid out
by token alike, and each of them moves as one array would.

SPECULATIVE=mtp's HiddenCarry holds no tokens: it is left out here, and the verify step sets it per row.

A linear-attention state (ArraysCache) folds every token into a fixed-size state and gives back none: the verify
pass records each such layer's state after every position (engine/speculative/linear.py), and row i keeps the one
after its last kept token. A sliding-window cache (RotatingKVCache) overwrites its oldest tokens in place and cannot
give back a suffix, so such a model verifies no drafts.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, BatchKVCache, CacheList, KVCache, dynamic_roll, make_prompt_cache

from engine.kvquant.cache import BatchQuantizedKVCache, BatchQuantizedLatentCache, QuantizedKV, QuantizedLatent
from engine.speculative import linear
from engine.speculative.carry import HiddenCarry

_WHY = {
    "RotatingKVCache": "a sliding-window cache overwrites its oldest tokens and cannot drop rejected drafts",
    "BatchRotatingKVCache": "a sliding-window cache overwrites its oldest tokens and cannot drop rejected drafts",
    "QuantizedRotating": "a sliding-window cache overwrites its oldest tokens and cannot drop rejected drafts",
    "BatchQuantizedRotating": "a sliding-window cache overwrites its oldest tokens and cannot drop rejected drafts",
    "ArraysCache": "its linear-attention layers are not ones whose state after each position can be recorded, so "
                   "it cannot drop rejected drafts",
}
# the kinds whose rows keep their tokens right-aligned at one write index, as BatchKVCache does
_SUFFIX_KINDS = (KVCache, BatchKVCache, QuantizedKV, BatchQuantizedKVCache, QuantizedLatent, BatchQuantizedLatentCache)


def can_verify(model_or_cache: Any) -> tuple[bool, str]:
    """Whether every layer's cache can drop a different number of last tokens per sequence (a model: as a fresh
    cache of its own says; or a list of layer caches), and if not, why."""
    given = isinstance(model_or_cache, (list, tuple))
    layers = _flat(model_or_cache if given else make_prompt_cache(model_or_cache))
    # a linear-attention state rolls back only where the layers that write it can be recorded (a model's)
    states = not given and linear.supports(model_or_cache, layers)
    for layer in layers:
        if type(layer) not in _SUFFIX_KINDS and not (states and type(layer) is ArraysCache):
            name = type(layer).__name__
            return False, _WHY.get(name, f"its {name} layers cannot drop rejected drafts per sequence")
    if layers and not any(type(layer) in _SUFFIX_KINDS for layer in layers):
        # a pipeline rank of linear layers alone: no KV says where the batch's positions stand (`held`), which
        # every rank must agree on to feed drafts of the same width
        return False, "this rank holds linear-attention layers only, and no KV layer to bound the drafts by"
    return True, ""


def drop_last(layers: list, counts: list[int], recorded: linear.Recording | None = None) -> None:
    """Make row i of every layer's batch cache forget its last counts[i] tokens (a linear-attention layer: take the
    state recorded after the pass's position width - 1 - counts[i])."""
    if not any(counts):
        return
    common = min(counts)
    extra = [n - common for n in counts]
    shifts = mx.array(extra) if any(extra) else None
    flat = _flat(layers)
    if any(isinstance(layer, ArraysCache) for layer in flat):
        width = next(iter(recorded.kept.values()))[1].shape[1]
        last = mx.array([width - 1 - n for n in counts])
        for layer in flat:
            if isinstance(layer, ArraysCache):
                recorded.select(layer, last)
        flat = [layer for layer in flat if not isinstance(layer, ArraysCache)]
    for layer in flat:
        if common:
            layer.trim(common)
        if shifts is not None:
            if layer.keys is not None:
                layer.keys = _each(layer.keys, lambda a: dynamic_roll(a, shifts[:, None], axis=2))
                layer.values = _each(layer.values, lambda a: dynamic_roll(a, shifts[:, None], axis=2))
            layer.left_padding = layer.left_padding + shifts
            layer.offset = layer.offset - shifts
    if shifts is not None:
        _drop_common_padding(flat)


def held(layers: list) -> int:
    """Positions the batch's caches hold per row (padding included): where the next forward pass writes."""
    flat = [layer for layer in _flat(layers) if not isinstance(layer, ArraysCache)]
    return flat[0]._idx if flat else 0


def _drop_common_padding(layers: list) -> None:
    """Cut the padding every row now starts with, as mlx-lm does when a batch shrinks. Left behind, it would grow
    the buffer by the most any row kept each step while each row grows by what it kept itself (rows accepting in
    turn), past the longest sequence the KV budget reserves every row for."""
    flat = _flat(layers)
    pad = min(flat[0].left_padding.tolist()) if flat else 0  # layers: the KV layers alone
    if pad <= 0:
        return
    for layer in flat:
        if layer.keys is not None:
            layer.keys = _each(layer.keys, lambda a: a[..., pad:, :])
            layer.values = _each(layer.values, lambda a: a[..., pad:, :])
        layer._idx -= pad
        layer.left_padding = layer.left_padding - pad


def _each(stored, fn):
    """fn applied to a cache's keys or values: one array, or a quantized cache's (packed, scales, biases)."""
    return tuple(fn(a) for a in stored) if isinstance(stored, tuple | list) else fn(stored)


def _flat(layers) -> list:
    out = []
    for layer in layers:
        if not isinstance(layer, HiddenCarry):
            out.extend(_flat(layer.caches) if isinstance(layer, CacheList) else [layer])
    return out
