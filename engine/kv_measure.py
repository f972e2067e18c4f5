"""What one sequence's caches take on this rank, measured from the model's own caches at load.

A config formula (layers x 2 x KV heads x head size) is right only for plain attention: MLA keeps one
compressed latent per token (replicated on every rank, not divided by tensor parallelism), a linear-
attention layer keeps a constant state, a sliding-window layer stops growing at its window. So every
rank builds the model's own cache (mlx-lm's make_prompt_cache), prefills a few tokens, then a few more,
and reads each layer's nbytes: the difference is what a token adds, the rest is constant state.

mlx-lm's caches grow their buffers in steps of 256 tokens; here each cache's step is set to one token
so the buffers are exactly as long as the tokens they hold, and the difference is per-token bytes,
not a buffer jump. Every rank runs the same forward passes (a sharded model's layers meet in their
collectives), then drops the cache and MLX's buffer cache again.

With KV_BITS set, the caches the model builds are already the quantized ones (engine/kvquant installs them at
load), so what is read is what they hold: packed integers, scales and biases; linear attention's state in float.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import CacheList, RotatingKVCache, make_prompt_cache

from engine.rank0.kv_budget import KVMemory

log = logging.getLogger(__name__)

# prompt lengths of the two prefills: short (fast on any model), and within any sliding window seen
FIRST, SECOND = 4, 12


class MeasureError(Exception):
    """The model's caches could not be measured; the message says why."""


def measure(model: Any) -> KVMemory:
    """This rank's KVMemory of model; raises MeasureError."""
    return measure_kv(model)[0]


def measure_kv(model: Any) -> tuple[KVMemory, str]:
    """measure(), and the float type the model computes its keys and values in ("" where no layer keeps any)."""
    try:
        before, after, dtype = _two_prefills(model)
    finally:
        mx.clear_cache()  # every array of the measurement is gone with _two_prefills' frame
    return classify(before, after), dtype


def _two_prefills(model: Any) -> tuple[list[tuple[str, int, int]], list[tuple[str, int, int]], str]:
    try:
        cache = make_prompt_cache(model)
    except Exception as exc:  # any model class's own make_cache: its failure only means "not measurable"
        raise MeasureError(f"make_prompt_cache failed: {exc!r}") from exc
    for layer in _leaves(cache):
        if hasattr(layer, "step"):
            layer.step = 1  # buffers exactly as long as their tokens
    try:
        first = _prefill(model, cache, range(1, FIRST + 1))
        second = _prefill(model, cache, range(FIRST + 1, SECOND + 1))
    except Exception as exc:  # a model that needs more than token ids (images, extra inputs)
        raise MeasureError(f"a {SECOND}-token prefill failed: {exc!r}") from exc
    return first, second, next(filter(None, map(_dtype, _leaves(cache))), "")


def _dtype(layer: Any) -> str:
    """The float type of a layer's keys: the array's own, or a quantized tuple's scales' (packed, scales, biases)."""
    keys = getattr(layer, "keys", None)
    if getattr(layer, "layout", None):  # KV_BITS's sliding window: packed rows, its float type named in its layout
        return f"mlx.core.{layer.layout[-1]}"
    if isinstance(keys, tuple):
        keys = keys[1]
    return str(keys.dtype) if keys is not None else ""


def classify(layers: list[tuple[str, int, int]], later: list[tuple[str, int, int]]) -> KVMemory:
    """KVMemory from each layer's (kind, window, nbytes) after FIRST and after SECOND tokens."""
    growing = capped = window = constant = 0
    for (kind, size, a), (_, _, b) in zip(layers, later, strict=True):
        per_token, rest = divmod(b - a, SECOND - FIRST)
        if per_token < 0 or rest:
            raise MeasureError(f"a {kind} layer went from {a} to {b} bytes over {SECOND - FIRST} tokens")
        if size and size < SECOND:  # size: a sliding window's (any RotatingKVCache, KV_BITS's too)
            per_token = a // FIRST  # a window this small was already trimmed: FIRST tokens fit in it
        base = max(0, a - per_token * FIRST)
        if size:
            capped, window = capped + per_token, max(window, size)
        else:
            growing += per_token
        constant += base
    return KVMemory(growing, capped, window, constant)


def _prefill(model: Any, cache: list[Any], ids: range) -> list[tuple[str, int, int]]:
    mx.eval(model(mx.array([list(ids)]), cache=cache))
    return [(type(c).__name__, getattr(c, "max_size", 0) if isinstance(c, RotatingKVCache) else 0, c.nbytes)
            for c in cache]


def _leaves(cache: list[Any]) -> list[Any]:
    out = []
    for c in cache:
        out.extend(_leaves(c.caches) if isinstance(c, CacheList) else [c])
    return out


def measure_or_none(model: Any) -> tuple[KVMemory | None, str]:
    """measure_kv(), logged; (None, "") and why where the caches cannot be measured."""
    started = time.perf_counter()
    try:
        memory, dtype = measure_kv(model)
    except MeasureError as exc:
        log.warning("KV memory: cannot measure the model's caches (%s); estimating from its config instead", exc)
        return None, ""
    log.info("KV memory measured in %.2f s: %s", time.perf_counter() - started, memory.describe())
    return memory, dtype
