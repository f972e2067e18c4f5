"""Every rank's prefix-cache entries (engine/lockstep/prefix.py) on real MLX caches."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from engine.lockstep.prefix import PrefixEntries


def _cache(tokens: int, layers: int = 2) -> list[KVCache]:
    out = []
    for layer in range(layers):
        c = KVCache()
        k = mx.arange(tokens * 4, dtype=mx.float32).reshape(1, 1, tokens, 4) + 1000 * layer
        c.update_and_fetch(k, -k)
        out.append(c)
    return out


def test_taking_a_short_prefix_copies_those_tokens_and_leaves_the_entry_whole():
    entries = PrefixEntries()
    entries.put(7, _cache(300), 300, 300)
    before = [mx.array(c.keys[..., :300, :]) for c in entries.entries[7]]

    taken = entries.take(7, 5)
    assert taken[0].offset == 5
    for c, whole in zip(taken, before):
        assert c.keys.shape[2] == 5 and c.values.shape[2] == 5  # the prefix, not the 300-token buffer
        assert mx.array_equal(c.keys, whole[..., :5, :])
        assert mx.array_equal(c.values, -whole[..., :5, :])

    # the new sequence extends its copy; the entry still holds its own 300 tokens
    for c in taken:
        c.update_and_fetch(mx.zeros((1, 1, 3, 4)), mx.zeros((1, 1, 3, 4)))
    assert taken[0].offset == 8
    assert entries.entries[7][0].offset == 300 and entries.lengths[7] == 300
    for c, whole in zip(entries.entries[7], before):
        assert mx.array_equal(c.keys[..., :300, :], whole)


def test_taking_the_whole_entry_twice_gives_two_independent_copies():
    entries = PrefixEntries()
    entries.put(1, _cache(40), 40, 40)
    a, b = entries.take(1, 40), entries.take(1, 40)
    a[0].update_and_fetch(mx.ones((1, 1, 1, 4)), mx.ones((1, 1, 1, 4)))
    assert a[0].offset == 41 and b[0].offset == 40
    assert mx.array_equal(b[0].keys, entries.entries[1][0].keys[..., :40, :])


def _batch_of_each_kind(rows: int, tokens: int) -> dict[str, object]:
    """A batch cache of every kind mlx-lm batches, `tokens` deep for each of `rows` sequences."""
    from mlx_lm.models.cache import ArraysCache, BatchKVCache, BatchRotatingKVCache

    kv = mx.random.normal((rows, 4, tokens, 16))
    plain = BatchKVCache([0] * rows)
    plain.update_and_fetch(kv, kv + 1)
    window = BatchRotatingKVCache(max_size=4 * tokens, left_padding=[0] * rows)
    window.update_and_fetch(kv, kv + 1)
    state = ArraysCache(2)
    state.cache = [mx.random.normal((rows, 3, 64)), mx.random.normal((rows, 4, 16, 16))]
    return {"kv": plain, "rotating": window, "arrays": state}


def test_a_kept_entry_of_every_cache_kind_holds_what_it_counts_not_the_batch_it_came_from():
    import gc

    from engine.lockstep.prefix import compact

    for kind in ("kv", "rotating", "arrays"):
        gc.collect()
        mx.clear_cache()
        base = mx.get_active_memory()
        batch = _batch_of_each_kind(8, 512)[kind]
        mx.eval([a for a in vars(batch).values() if isinstance(a, mx.array)] + list(getattr(batch, "cache", [])))
        layer = batch.extract(3)
        length = layer.offset if hasattr(layer, "offset") else 0
        kept = compact([layer], length)
        del batch, layer
        gc.collect()
        mx.clear_cache()
        counted = sum(c.nbytes for c in kept)
        held = mx.get_active_memory() - base
        assert counted > 0 and held <= counted + 4096, f"{kind}: {held} bytes held for {counted} counted"


def _hybrid(tokens: int, window: int = 16) -> list:
    """A linear-attention state, a sliding window and a plain KV layer, `tokens` deep."""
    from mlx_lm.models.cache import ArraysCache, RotatingKVCache

    state = ArraysCache(2)
    state.cache = [mx.ones((1, 3, 8)) * tokens, mx.ones((1, 2, 4, 4))]
    rotating = RotatingKVCache(max_size=window)
    kv = KVCache()
    for _ in range(tokens):
        k = mx.ones((1, 1, 1, 4))
        rotating.update_and_fetch(k, k)
        kv.update_and_fetch(k, k)
    return [state, rotating, kv]


def test_a_cache_that_cannot_be_cut_is_kept_only_at_the_length_it_holds_and_taken_only_whole():
    import pytest

    entries = PrefixEntries()
    entries.put(1, _hybrid(40), 39, 40)  # one token too many, and a state cannot give it back
    assert 1 not in entries.entries
    entries.put(2, _hybrid(40), 40, 40)
    assert entries.lengths[2] == 40 and entries.nbytes() == sum(c.nbytes for c in entries.entries[2])
    whole = entries.take(2, 40)
    assert [type(c).__name__ for c in whole] == ["ArraysCache", "RotatingKVCache", "KVCache"]
    assert whole[1].offset == 40 and whole[2].offset == 40 and whole[0].cache[0] is not entries.entries[2][0].cache[0]
    with pytest.raises(RuntimeError, match="cannot be cut"):
        entries.take(2, 30)  # rank 0 never plans this


def test_a_sliding_window_that_has_not_wrapped_is_cut_and_keeps_only_its_tokens():
    from mlx_lm.models.cache import RotatingKVCache

    entries = PrefixEntries()
    window = _hybrid(10, window=64)[1:]  # a window and a plain KV layer
    entries.put(3, window, 8, 10)
    kept = entries.entries[3]
    assert isinstance(kept[0], RotatingKVCache) and kept[0].offset == 8 and kept[0].keys.shape[2] == 8
    assert entries.take(3, 5)[0].offset == 5


def test_a_quantized_sliding_window_is_stored_packed_cut_and_keeps_only_its_tokens():
    """KV_BITS's window (engine/kvquant/rotating.py) is kept as the float one is, in its packed rows."""
    from engine.kvquant.rotating import QuantizedRotating

    window = QuantizedRotating(64, group_size=32, bits=8)
    for i in range(10):
        k = mx.random.normal((1, 1, 1, 32), key=mx.random.key(i))
        window.update_and_fetch(k, k)
    entries = PrefixEntries()
    entries.put(4, [window], 8, 10)
    (kept,) = entries.entries[4]
    assert type(kept) is QuantizedRotating and kept.offset == 8 and kept.keys.shape[2] == 8
    assert kept.keys.dtype == mx.uint32 and entries.nbytes() == kept.nbytes
    (taken,) = entries.take(4, 5)
    assert taken.offset == 5 and taken.layout == window.layout
    assert mx.array_equal(taken.keys[..., :5, :], window.keys[..., :5, :])


def test_each_cache_kind_is_asked_how_many_arrays_it_holds():
    """Metal counts buffers, not bytes: a quantized layer holds its scales and biases too, a linear-attention layer
    its states, a layer of several caches theirs."""
    from mlx_lm.models.cache import ArraysCache, CacheList, QuantizedKVCache, RotatingKVCache

    from engine.lockstep.buffers import cache_arrays

    kv = mx.random.normal((1, 2, 8, 64))
    quantized, window, state = QuantizedKVCache(group_size=64, bits=4), RotatingKVCache(max_size=4), ArraysCache(2)
    for c in (quantized, window):
        c.update_and_fetch(kv, kv)
    state.cache = [mx.zeros((1, 3, 64)), mx.zeros((1, 4, 16, 16))]
    assert cache_arrays(_cache(8, layers=1)) == 2
    assert cache_arrays([quantized]) == 6 and cache_arrays([window]) == 2 and cache_arrays([state]) == 2
    assert cache_arrays([CacheList(*_cache(8)), KVCache(), ArraysCache(2)]) == 4  # empty caches hold none
