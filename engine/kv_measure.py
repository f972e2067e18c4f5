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

With KV_BITS set, each layer's bytes are what it holds quantized: a KVCache converted by mlx-lm's own
to_quantized (packed integers, scales and biases, as the batch stores them), another kind's keys and values
through mx.quantize; linear attention's state stays in float. Nothing of the conversion is evaluated: an
array's nbytes follows from its shape.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import CacheList, KVCache, RotatingKVCache, make_prompt_cache

from engine.rank0.kv_budget import KVMemory
from engine.rank0.kv_precision import label

log = logging.getLogger(__name__)

# prompt lengths of the two prefills: short (fast on any model), and within any sliding window seen
FIRST, SECOND = 4, 12
# what _prefill reads of each layer: its kind, its window (sliding-window layers, else 0) and its bytes
Layer = tuple[str, int, int]


class MeasureError(Exception):
    """The model's caches could not be measured; the message says why."""


def measure(model: Any, bits: int | None = None, group_size: int = 64) -> KVMemory:
    """This rank's KVMemory of model, its keys and values stored in bits (None: as the model computes them);
    raises MeasureError."""
    return measure_kv(model, bits, group_size)[0]


def measure_kv(model: Any, bits: int | None = None, group_size: int = 64) -> tuple[KVMemory, str]:
    """measure(), and the float type the model's keys and values come in ("" where no layer holds any)."""
    try:
        before, after, dtype = _two_prefills(model, bits, group_size)
    finally:
        mx.clear_cache()  # every array of the measurement is gone with _two_prefills' frame
    return classify(before, after), dtype


def _two_prefills(model: Any, bits: int | None, group_size: int) -> tuple[list[Layer], list[Layer], str]:
    try:
        cache = make_prompt_cache(model)
    except Exception as exc:  # any model class's own make_cache: its failure only means "not measurable"
        raise MeasureError(f"make_prompt_cache failed: {exc!r}") from exc
    for layer in _leaves(cache):
        if hasattr(layer, "step"):
            layer.step = 1  # buffers exactly as long as their tokens
    first = _prefill(model, cache, range(1, FIRST + 1), bits, group_size)
    second = _prefill(model, cache, range(FIRST + 1, SECOND + 1), bits, group_size)
    dtype = next((str(c.keys.dtype) for c in _leaves(cache) if getattr(c, "keys", None) is not None), "")
    return first, second, dtype


def classify(layers: list[tuple[str, int, int]], later: list[tuple[str, int, int]]) -> KVMemory:
    """KVMemory from each layer's (kind, window, nbytes) after FIRST and after SECOND tokens."""
    growing = capped = window = constant = 0
    for (kind, size, a), (_, _, b) in zip(layers, later, strict=True):
        per_token, rest = divmod(b - a, SECOND - FIRST)
        if per_token < 0 or rest:
            raise MeasureError(f"a {kind} layer went from {a} to {b} bytes over {SECOND - FIRST} tokens")
        if kind == "RotatingKVCache" and size < SECOND:
            per_token = a // FIRST  # a window this small was already trimmed: FIRST tokens fit in it
        base = max(0, a - per_token * FIRST)
        if kind == "RotatingKVCache":
            capped, window = capped + per_token, max(window, size)
        else:
            growing += per_token
        constant += base
    return KVMemory(growing, capped, window, constant)


def _prefill(model: Any, cache: list[Any], ids: range, bits: int | None, group_size: int) -> list[Layer]:
    try:
        mx.eval(model(mx.array([list(ids)]), cache=cache))
    except Exception as exc:  # a model that needs more than token ids (images, extra inputs)
        raise MeasureError(f"a {SECOND}-token prefill failed: {exc!r}") from exc
    return [(type(c).__name__, getattr(c, "max_size", 0) if isinstance(c, RotatingKVCache) else 0,
             stored_nbytes(c, bits, group_size)) for c in cache]


def stored_nbytes(cache: Any, bits: int | None, group_size: int) -> int:
    """The bytes one layer's cache holds with its keys and values stored in bits (None: as they are)."""
    if isinstance(cache, CacheList):
        return sum(stored_nbytes(c, bits, group_size) for c in cache.caches)
    if bits is None or getattr(cache, "keys", None) is None:  # as computed, or a state without keys (ArraysCache)
        return cache.nbytes
    try:
        if isinstance(cache, KVCache):
            return cache.to_quantized(group_size, bits).nbytes
        # a kind mlx-lm cannot convert (RotatingKVCache): its keys and values as mx.quantize stores them
        return sum(a.nbytes for x in (cache.keys, cache.values)
                   for a in mx.quantize(x, group_size=group_size, bits=bits))
    except ValueError as exc:  # rows mx.quantize cannot split into groups
        raise MeasureError(f"a {type(cache).__name__} layer's rows of {cache.keys.shape[-1]} keys and "
                           f"{cache.values.shape[-1]} values cannot be stored in {bits} bits: KV_GROUP_SIZE="
                           f"{group_size} must divide both") from exc


def _leaves(cache: list[Any]) -> list[Any]:
    out = []
    for c in cache:
        out.extend(_leaves(c.caches) if isinstance(c, CacheList) else [c])
    return out


def measure_or_none(model: Any, bits: int | None = None, group_size: int = 64) -> tuple[KVMemory | None, str]:
    """measure_kv(), logged; (None, "") and why where the caches cannot be measured."""
    started = time.perf_counter()
    try:
        memory, dtype = measure_kv(model, bits, group_size)
    except MeasureError as exc:
        log.warning("KV memory: cannot measure the model's caches (%s); estimating from its config instead", exc)
        return None, ""
    log.info("KV memory measured in %.2f s: %s (%s)", time.perf_counter() - started, memory.describe(),
             label(bits, group_size, dtype))
    return memory, dtype
