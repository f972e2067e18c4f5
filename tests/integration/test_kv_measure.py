"""The KV estimate of every zoo model, from its caches measured at load, against the bytes its caches really
hold: never below them, and within 1.25x of them after a prefill of a few hundred tokens (longer than the
32-token sliding windows), for plain KV, MLA's latent, linear-attention hybrids and sliding windows; with KV_BITS,
what the same caches take stored quantized."""

from __future__ import annotations

import pytest

from engine.zoo import ensure_zoo_model
from engine.zoo.names import ARCH_MODELS as ZOO_MODELS
from tests.harness import MODEL_CACHE

TOKENS = 300
CHUNK = 64


def loaded(name: str):
    from mlx_lm import load

    return load(str(ensure_zoo_model(name, MODEL_CACHE)))[0]


def real_bytes(cache) -> int:
    return sum(c.nbytes for c in cache)


@pytest.mark.parametrize("name", ZOO_MODELS)
def test_the_estimate_covers_a_prefill_and_stays_within_a_quarter_of_it(name: str) -> None:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from engine.kv_measure import measure
    from engine.rank0.kv_budget import KVBudget

    model = loaded(name)
    memory = measure(model)
    kv = KVBudget.of(1 << 40, memory, 512)  # the engine's default chunk: the whole prompt in one prefill
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([list(range(1, TOKENS + 1))]), cache=cache))
    real = real_bytes(cache)
    assert real <= kv.sequence(TOKENS, 0) <= 1.25 * real, (memory, real, kv.sequence(TOKENS, 0))


@pytest.mark.parametrize("name", ["qwen3", "deepseek-v3", "qwen3.5", "qwen3-next", "gpt-oss", "ministral3"])
def test_the_estimate_is_never_below_what_chunked_prefill_and_decoding_hold(name: str) -> None:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from engine.kv_measure import measure
    from engine.rank0.kv_budget import KVBudget

    model = loaded(name)
    kv = KVBudget.of(1 << 40, measure(model), CHUNK)
    cache = make_prompt_cache(model)
    fed = 0
    for start in range(0, TOKENS, CHUNK):
        ids = list(range(start + 1, min(TOKENS, start + CHUNK) + 1))
        mx.eval(model(mx.array([ids]), cache=cache))
        fed += len(ids)
        assert real_bytes(cache) <= kv.sequence(fed, 0), fed
    for _ in range(40):  # decoding: sliding windows trim back to their size, full layers grow a step
        mx.eval(model(mx.array([[7]]), cache=cache))
        fed += 1
        assert real_bytes(cache) <= kv.sequence(fed, 0), fed


def test_admission_reserves_at_least_what_the_batch_holds_at_its_peak_over_a_long_prompt() -> None:
    """Through the engine's own batch (mlx-lm's BatchGenerator, the engine's default prefill chunk), at every step:
    a sliding window holds its last window - 1 tokens next to a whole prefill chunk, far more than the window."""
    from engine import mlx_compat
    from engine.kv_measure import measure
    from engine.lockstep.batch import LockstepBatch
    from engine.lockstep.plan import Insert, Plan
    from engine.rank0.kv_budget import KVBudget

    model = loaded("gpt-oss")
    kv = KVBudget.of(1 << 40, measure(model), 512)
    batch = LockstepBatch(model, set(), 512, 1)
    prompt, answer = [(i * 7) % 200 + 5 for i in range(1024)], 4  # past the window and two prefill chunks
    batch.apply(Plan(step=0, fingerprint=batch.fingerprint(0), token_check=0,
                     inserts=[Insert(rid="a", tokens=prompt, max_tokens=answer)]))
    held = []
    for _ in range(len(prompt) // 512 + answer):
        batch.step()
        held.append(sum(c.nbytes for layers in mlx_compat.batch_caches(batch.gen) for c in layers))
    assert max(held) <= kv.sequence(len(prompt), answer), (max(held), kv.sequence(len(prompt), answer))


def test_measuring_is_fast_and_leaves_no_memory_behind() -> None:
    import time

    import mlx.core as mx

    from engine.kv_measure import measure

    model = loaded("deepseek-v3")
    mx.clear_cache()
    before = mx.get_active_memory()
    started = time.perf_counter()
    memory = measure(model)
    assert time.perf_counter() - started < 1.0
    assert mx.get_active_memory() <= before and mx.get_cache_memory() == 0
    # MLA: one latent of kv_lora_rank plus one RoPE key per token and layer, float32, not per-head K and V
    assert (memory.token_bytes, memory.window_token_bytes, memory.constant_bytes) == (2 * (64 + 16) * 4, 0, 0)


def test_a_model_that_cannot_be_measured_says_why_and_gives_none(caplog) -> None:
    from mlx_lm.models.cache import KVCache

    from engine.kv_measure import measure_or_none

    class NeedsImages:  # a model whose forward pass wants more than token ids
        def make_cache(self):
            return [KVCache()]

        def __call__(self, tokens, cache):
            raise TypeError("missing pixel_values")

    caplog.set_level("WARNING")
    assert measure_or_none(NeedsImages()) == (None, "")
    assert "cannot measure the model's caches" in caplog.text and "missing pixel_values" in caplog.text


def fall(bits: int, dtype_bytes: int) -> float:
    """What a row of 64 keys keeps of its float size, stored in bits with groups of 64."""
    from engine.rank0.kv_precision import row_bytes

    return row_bytes(64, dtype_bytes, bits, 64) / row_bytes(64, dtype_bytes, None, 64)


@pytest.mark.parametrize("family", ["llama", "qwen3-next", "deepseek-v3", "ministral3"])
def test_quantized_caches_measure_what_the_bits_say_and_linear_attention_state_stays_float(family: str):
    """The zoo's layer patterns with heads of 64 (engine/zoo/wide.py; the zoo's own 16 are refused), float32, with
    KV_BITS's caches installed as at load: plain KV, full attention beside linear attention, MLA's latent, a
    sliding window beside full attention."""
    from engine.kv_measure import measure_kv
    from engine.kvquant.kinds import install
    from engine.zoo.wide import wide_model

    full, dtype = measure_kv(wide_model(family))
    assert dtype == "mlx.core.float32"
    for bits in (8, 4):
        model = wide_model(family)
        install(model, bits, 64)
        quantized, dtype = measure_kv(model)
        assert dtype == "mlx.core.float32"  # read from the scales of the quantized keys
        assert quantized.token_bytes == full.token_bytes * fall(bits, 4), (bits, quantized, full)
        assert quantized.window_token_bytes == full.window_token_bytes * fall(bits, 4), (bits, quantized, full)
        assert quantized.window == full.window
        assert quantized.constant_bytes == full.constant_bytes
