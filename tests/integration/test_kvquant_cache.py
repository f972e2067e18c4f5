"""The batched quantized KV cache (engine/kvquant) on real MLX arrays, without the engine: every row holds exactly
what mlx-lm's QuantizedKVCache holds for that sequence alone, through merge, extend, filter, padding, trims and
rollback; a batch decodes what one sequence with mlx-lm's cache decodes; and the kinds it cannot take are refused."""

from __future__ import annotations

from itertools import islice

import mlx.core as mx
import pytest
from mlx_lm.models.cache import ArraysCache, ChunkedKVCache, KVCache, QuantizedKVCache, RotatingKVCache

from engine.kvquant.cache import BatchQuantizedKVCache, QuantizedKV
from engine.kvquant.kinds import install, refusal
from engine.speculative.rollback import can_verify, drop_last

GROUP, BITS, HEADS, DIM = 32, 8, 2, 64


def _kv(rows: int, tokens: int, seed: int) -> tuple[mx.array, mx.array]:
    key = mx.random.key(seed)
    k, v = mx.random.normal((2, rows, HEADS, tokens, DIM), key=key)
    return k, v


def _own(tokens: int, seed: int, bits: int = BITS) -> QuantizedKVCache:
    """One sequence alone, in mlx-lm's own quantized cache."""
    c = QuantizedKVCache(GROUP, bits)
    c.update_and_fetch(*_kv(1, tokens, seed))
    return c


def _same(batch: BatchQuantizedKVCache, i: int, alone: QuantizedKVCache) -> None:
    row = batch.extract(i)
    assert row.offset == alone.offset
    for got, want in zip((row.keys, row.values), alone.keys_and_values()):
        for a, b in zip(got, want):
            assert a.shape == b.shape and mx.array_equal(a, b)


def _feed(batch: BatchQuantizedKVCache, alone: list[QuantizedKVCache], tokens: int, seed: int) -> None:
    """The same new tokens into the batch and into each row's own cache."""
    k, v = _kv(len(alone), tokens, seed)
    batch.update_and_fetch(k, v)
    for i, c in enumerate(alone):
        c.update_and_fetch(k[i:i + 1], v[i:i + 1])


@pytest.mark.parametrize("bits", [8, 4])
def test_merged_sequences_decode_into_the_rows_each_sequence_would_hold_alone(bits):
    alone = [_own(5, 1, bits), _own(300, 2, bits), _own(17, 3, bits)]  # past one 256-token step of the buffer
    batch = BatchQuantizedKVCache.merge([QuantizedKV.from_state(c.state) for c in alone])
    assert batch.bits == bits and batch.group_size == GROUP  # what mlx-lm's attention reads to go quantized
    for step in range(3):
        _feed(batch, alone, 1, 10 + step)
    for i, c in enumerate(alone):
        _same(batch, i, c)
    assert batch.offset.tolist() == [8, 303, 20]


def test_extend_and_filter_keep_every_remaining_row_as_it_was():
    a, b, c = _own(40, 4), _own(9, 5), _own(70, 6)
    batch = BatchQuantizedKVCache.merge([a, b])
    other = BatchQuantizedKVCache.merge([c])
    batch.extend(other)
    _feed(batch, [a, b, c], 2, 7)
    batch.filter([0, 2])  # b leaves; the padding both remaining rows share is cut
    assert batch.size() == 72 and min(batch.left_padding.tolist()) == 0
    _feed(batch, [a, c], 1, 8)
    _same(batch, 0, a)
    _same(batch, 1, c)


def test_a_right_padded_prefill_chunk_lands_in_each_row_as_its_own_tokens():
    """mlx-lm prefills prompts of different lengths right padded, then rolls each row back into place."""
    batch = BatchQuantizedKVCache.merge([QuantizedKV(GROUP, BITS), QuantizedKV(GROUP, BITS)])
    k, v = _kv(2, 6, 9)
    batch.prepare(lengths=[6, 4], right_padding=[0, 2])
    batch.update_and_fetch(k, v)
    batch.finalize()
    short = QuantizedKVCache(GROUP, BITS)
    short.update_and_fetch(k[1:, :, :4], v[1:, :, :4])
    long = QuantizedKVCache(GROUP, BITS)
    long.update_and_fetch(k[:1], v[:1])
    _same(batch, 0, long)
    _same(batch, 1, short)


def test_speculative_rollback_drops_each_rows_own_count_of_last_tokens():
    alone = [_own(12, 11), _own(30, 12)]
    batch = BatchQuantizedKVCache.merge(alone)
    assert can_verify([batch])[0] and can_verify([QuantizedKV()])[0]
    _feed(batch, alone, 5, 13)  # a verify pass: next input and four drafts per row
    drop_last([batch], [4, 1])  # row 0 kept one token, row 1 four
    alone[0].trim(4)
    alone[1].trim(1)
    for i, c in enumerate(alone):
        _same(batch, i, c)
    _feed(batch, alone, 1, 14)
    for i, c in enumerate(alone):
        _same(batch, i, c)


def _tiny_llama(head_dim: int = DIM):
    from mlx_lm.models import llama

    args = llama.ModelArgs(model_type="llama", hidden_size=128, num_hidden_layers=2, intermediate_size=128,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, rms_norm_eps=1e-5,
                           vocab_size=97, tie_word_embeddings=False)
    mx.random.seed(3)
    model = llama.Model(args)
    mx.eval(model.parameters())
    return model


def _batch_decode(model, prompts: list[list[int]], n: int) -> tuple[list[list[int]], list]:
    """n greedy tokens per prompt from mlx-lm's BatchGenerator (prompts prefilled together, in chunks of 16), and
    its decoding batch's caches."""
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(model, stop_tokens=[], prefill_step_size=16)
    uids = gen.insert(prompts, max_tokens=[n] * len(prompts))
    got = {uid: [] for uid in uids}
    while any(len(t) < n for t in got.values()):
        for r in gen.next()[1]:
            got[r.uid].append(r.token)
    return [got[u] for u in uids], gen._generation_batch.prompt_cache


@pytest.mark.parametrize("bits", [8, 4])
def test_a_batch_decodes_what_each_sequence_decodes_alone_with_mlx_lms_quantized_cache(bits):
    from mlx_lm.generate import generate_step

    model = _tiny_llama()
    prompts = [[5, 9, 11, 3, 7, 2, 8], [4, 4, 6], list(range(10, 50))]
    want = []
    for p in prompts:
        cache = [QuantizedKVCache(GROUP, bits) for _ in model.layers]
        want.append([int(t) for t, _ in islice(generate_step(mx.array(p), model, prompt_cache=cache), 12)])
    install(model, bits, GROUP)
    got, cache = _batch_decode(model, prompts, 12)
    assert got == want
    assert all(type(c) is BatchQuantizedKVCache for c in cache)


def test_kinds_it_cannot_quantize_are_refused_naming_the_kind_and_linear_attention_stays_as_it_is():
    model = _tiny_llama()
    assert refusal(model, None, GROUP) is None
    assert refusal(model, 4, 64) is None
    chunked = refusal(model, 8, GROUP, [KVCache(), ChunkedKVCache(32)])
    assert chunked == "KV_BITS=8 cannot quantize this model's chunked-attention layers (ChunkedKVCache): set KV_BITS=off to serve it"
    assert refusal(model, 8, GROUP, [KVCache(), RotatingKVCache(32)]) is None  # sliding windows are quantized
    assert refusal(model, 8, GROUP, [ArraysCache(2), KVCache()]) is None
    install(model, 8, GROUP)
    narrow = _tiny_llama(head_dim=16)
    why = refusal(narrow, 8, 32)
    assert why is not None and "head_dim of 16 is not a multiple of 32" in why and "KV_BITS=off" in why
    assert "KV_GROUP_SIZE=64" in refusal(_tiny_llama(head_dim=64), 8, 128)


@pytest.mark.parametrize("bits", [8, 4])
def test_eight_and_four_bits_store_about_half_and_a_quarter_of_float16_scales_counted(bits):
    c = QuantizedKV(64, bits)
    k = mx.random.normal((1, HEADS, 256, 128)).astype(mx.float16)
    c.update_and_fetch(k, k)
    ratio = c.nbytes / (2 * k.nbytes)
    assert ratio == pytest.approx({8: 0.53125, 4: 0.28125}[bits])


def _tiny_deepseek():
    """MLA as DeepSeek V3 has it (its latent and rotary key as long as a group allows), one dense and one MoE layer."""
    from mlx_lm.models import deepseek_v3

    args = deepseek_v3.ModelArgs(vocab_size=97, hidden_size=128, intermediate_size=128, moe_intermediate_size=64,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                 n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2, kv_lora_rank=64,
                                 q_lora_rank=32, qk_rope_head_dim=32, v_head_dim=32, qk_nope_head_dim=32,
                                 first_k_dense_replace=1)
    mx.random.seed(4)
    model = deepseek_v3.Model(args)
    mx.eval(model.parameters())
    return model


def test_mla_keeps_its_latent_quantized_and_decodes_as_one_sequence_does_with_the_same_storage():
    from mlx_lm.generate import generate_step

    from engine.kvquant.cache import BatchQuantizedLatentCache, QuantizedLatent

    model = _tiny_deepseek()
    prompts = [[5, 9, 11, 3, 7, 2, 8], list(range(10, 40))]
    install(model, BITS, GROUP)
    want = [[int(t) for t, _ in islice(generate_step(mx.array(p), model, prompt_cache=model.make_cache()), 10)]
            for p in prompts]
    assert all(type(c) is QuantizedLatent for c in model.make_cache())
    got, cache = _batch_decode(model, prompts, 10)
    assert got == want
    assert all(type(c) is BatchQuantizedLatentCache for c in cache)
    assert all(c.keys[0].dtype == mx.uint32 for c in cache)  # the latent is stored packed
    assert can_verify(model)[0]
