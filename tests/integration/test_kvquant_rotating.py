"""Quantized sliding windows (engine/kvquant/rotating.py) on real MLX arrays, without the engine: one window holds
exactly mx.quantize of what mlx-lm's float RotatingKVCache holds, wrap included; every batch row holds what its
sequence's window holds alone, through merge, extend, filter, extract and the wrap; and a batch of a model with
sliding-window layers decodes what one sequence decodes alone."""

from __future__ import annotations

from itertools import islice

import mlx.core as mx
import pytest
from mlx_lm.models.cache import RotatingKVCache

from engine.kvquant.rotating import BatchQuantizedRotating, QuantizedRotating

GROUP, BITS, HEADS, DIM, WINDOW = 32, 8, 2, 64, 16


def _kv(rows: int, tokens: int, seed: int) -> tuple[mx.array, mx.array]:
    k, v = mx.random.normal((2, rows, HEADS, tokens, DIM), key=mx.random.key(seed))
    return k.astype(mx.float16), v.astype(mx.float16)


def _window(c: RotatingKVCache) -> mx.array:
    """A single window's keys in temporal order, its last size() slots."""
    return c._temporal_order(c.keys)[..., -c.size():, :]


@pytest.mark.parametrize("bits", [8, 4])
def test_a_window_holds_mx_quantize_of_what_mlx_lms_float_window_holds_through_the_wrap(bits):
    own, ref = QuantizedRotating(WINDOW, group_size=GROUP, bits=bits), RotatingKVCache(WINDOW)
    assert own.bits == bits  # what mlx-lm's attention reads to go quantized
    for seed, n in enumerate([11, 1, 1, 9, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 24, 1, 1]):
        k, v = _kv(1, n, seed)
        got, want = own.update_and_fetch(k, v), ref.update_and_fetch(k, v)
        for g, w in zip(got, want):
            for a, b in zip(g, mx.quantize(w, group_size=GROUP, bits=bits)):
                assert a.shape == b.shape and mx.array_equal(a, b)
    assert ref.offset > 3 * WINDOW and own.offset == ref.offset
    assert own.nbytes < 0.6 * ref.nbytes  # stored packed, never as the float window


def _alone(tokens: int, seed: int) -> QuantizedRotating:
    c = QuantizedRotating(WINDOW, group_size=GROUP, bits=BITS)
    c.update_and_fetch(*_kv(1, tokens, seed))
    return c


def _feed(batch, alone, tokens: int, seed: int) -> None:
    k, v = _kv(len(alone), tokens, seed)
    batch.update_and_fetch(k, v)
    for i, c in enumerate(alone):
        c.update_and_fetch(k[i:i + 1], v[i:i + 1])


def _same(batch: BatchQuantizedRotating, i: int, alone: QuantizedRotating) -> None:
    row = batch.extract(i)
    assert type(row) is QuantizedRotating and row.offset == alone.offset and row.layout == alone.layout
    assert mx.array_equal(_window(row), _window(alone))
    assert mx.array_equal(row.values[..., -row.size():, :], alone._temporal_order(alone.values)[..., -alone.size():, :])


def test_batch_rows_hold_each_sequences_own_window_through_merge_extend_filter_and_the_wrap():
    a, b, c = _alone(5, 1), _alone(30, 2), _alone(12, 3)  # b has wrapped already
    batch = BatchQuantizedRotating.merge([a, b])
    assert batch.bits == BITS and batch.group_size == GROUP
    batch.extend(BatchQuantizedRotating.merge([c]))
    for step in range(WINDOW + 3):  # every row wraps while decoding
        _feed(batch, [a, b, c], 1, 10 + step)
    for i, own in enumerate([a, b, c]):
        _same(batch, i, own)
    batch.filter([0, 2])  # b leaves
    for step in range(5):
        _feed(batch, [a, c], 1, 40 + step)
    _same(batch, 0, a)
    _same(batch, 1, c)
    # a row extracted and merged again (the prefix cache, a preempted sequence) decodes on as before
    again = BatchQuantizedRotating.merge([batch.extract(1)])
    for step in range(3):
        _feed(again, [c], 1, 50 + step)
    _same(again, 0, c)


def test_a_right_padded_prefill_past_the_window_lands_in_each_row_as_its_own_tokens():
    """mlx-lm prefills prompts of different lengths right padded, then rolls each row back into place."""
    batch = BatchQuantizedRotating.merge([QuantizedRotating(WINDOW, group_size=GROUP, bits=BITS) for _ in range(2)])
    k, v = _kv(2, 24, 21)
    first, rest = slice(0, 12), slice(12, 24)
    batch.prepare(lengths=[24, 19], right_padding=[0, 5])
    batch.update_and_fetch(k[..., first, :], v[..., first, :])
    batch.update_and_fetch(k[..., rest, :], v[..., rest, :])
    batch.finalize()
    alone = [QuantizedRotating(WINDOW, group_size=GROUP, bits=BITS) for _ in range(2)]
    for c, row, n in zip(alone, (0, 1), (24, 19)):
        c.update_and_fetch(k[row:row + 1, :, :12], v[row:row + 1, :, :12])
        c.update_and_fetch(k[row:row + 1, :, 12:n], v[row:row + 1, :, 12:n])
    _feed(batch, alone, 1, 22)
    _same(batch, 0, alone[0])
    _same(batch, 1, alone[1])


def test_a_fetch_is_the_triple_mlx_lms_quantized_attention_reads():
    c = QuantizedRotating(WINDOW, group_size=GROUP, bits=4)
    k, v = _kv(1, 7, 5)
    (words, scales, biases), _ = c.update_and_fetch(k, v)
    assert c.keys.dtype == mx.uint32 and c.keys.shape[-1] == DIM * 4 // 32 + DIM // GROUP  # one row per token
    assert (words.dtype, scales.dtype, biases.dtype) == (mx.uint32, mx.float16, mx.float16)
    assert mx.allclose(mx.dequantize(words, scales, biases, group_size=GROUP, bits=4), k, atol=0.5)


def _wide(family: str):
    from engine.zoo.wide import wide_model

    mx.random.seed(7)
    model = wide_model(family)  # a sliding-window layer (window 32) and a full one, heads of 64
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("bits", [8, 4])
def test_a_batch_with_sliding_window_layers_decodes_what_each_sequence_decodes_alone(bits):
    from mlx_lm.generate import BatchGenerator, generate_step
    from engine.kvquant.cache import BatchQuantizedKVCache, QuantizedKV
    from engine.kvquant.kinds import install, refusal
    from engine.speculative.rollback import can_verify

    model = _wide("ministral3")
    assert refusal(model, bits, 64) is None
    install(model, bits, 64)
    assert [type(c) for c in model.make_cache()] == [QuantizedRotating, QuantizedKV]
    prompts = [[5, 9, 11, 3, 7, 2, 8], list(range(10, 60)), [4, 4, 6]]  # the second is past the window of 32
    n = 40  # every sequence's window wraps while decoding
    want = [[int(t) for t, _ in islice(generate_step(mx.array(p), model, prompt_cache=model.make_cache()), n)]
            for p in prompts]
    gen = BatchGenerator(model, stop_tokens=[], prefill_step_size=16)
    uids = gen.insert(prompts, max_tokens=[n] * len(prompts))
    got, kinds = {uid: [] for uid in uids}, []
    while any(len(t) < n for t in got.values()):
        for r in gen.next()[1]:
            got[r.uid].append(r.token)
        kinds = kinds or [type(c) for c in gen._generation_batch.prompt_cache]
    assert [got[u] for u in uids] == want
    assert kinds == [BatchQuantizedRotating, BatchQuantizedKVCache]
    # a window cannot drop rejected drafts, quantized or not: speculative decoding stays off, saying why
    assert can_verify(model) == (False, "a sliding-window cache overwrites its oldest tokens and cannot drop "
                                        "rejected drafts")


def test_attention_with_sinks_stays_refused_in_one_sentence():
    from engine.kvquant.kinds import refusal

    assert refusal(_wide("gpt-oss"), 8, 64) == (
        "KV_BITS=8 cannot quantize this model's attention with sinks (gpt-oss): mlx-lm's quantized attention does "
        "not take them; set KV_BITS=off to serve it")
