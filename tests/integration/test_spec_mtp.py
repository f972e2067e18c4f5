"""SPECULATIVE=mtp's model: the target wrapped with its checkpoint's MTP heads. Its caches carry the heads' KV and
the hidden carry through BatchGenerator, the KV measure and the prefix cache's rules; a checkpoint without heads is
refused in engine.mtp's sentence."""

from __future__ import annotations

from pathlib import Path

import pytest

from config import load_settings
from engine.model import LoadedModel, ModelError
from engine.zoo import ensure_zoo_model
from tests.harness import MODEL_CACHE

mx = pytest.importorskip("mlx.core")

from mlx_lm import load as mlx_load  # noqa: E402

from engine.kv_measure import measure  # noqa: E402
from engine.kvquant.kinds import install  # noqa: E402
from engine.lockstep.batch import LockstepBatch  # noqa: E402
from engine.lockstep.plan import Insert, Plan  # noqa: E402
from engine.lockstep.prefix import model_cuts  # noqa: E402
from engine.speculative.mtp import MtpProposer, mtp_refusal  # noqa: E402
from engine.speculative.mtp_model import with_heads  # noqa: E402
from engine.speculative.rollback import can_verify, drop_last  # noqa: E402


def _loaded(name: str) -> LoadedModel:
    folder = ensure_zoo_model(name, MODEL_CACHE)
    model, tokenizer = mlx_load(str(folder))
    return LoadedModel(model=model, tokenizer=tokenizer, path=str(folder), context_length=4096)


def test_the_heads_kv_is_counted_rolled_back_and_keeps_prefix_entries_whole() -> None:
    loaded = _loaded("deepseek-v3-mtp")
    wrapped = with_heads(loaded)
    assert can_verify(wrapped) == (True, "")
    # admission reserves the heads' KV per token too, and the carry's constant bytes
    plain, mtp = measure(loaded.model), measure(wrapped)
    assert mtp.token_bytes > plain.token_bytes and mtp.constant_bytes > 0
    # the carry holds the hidden at an entry's end: an entry is reused only where a prompt extends it exactly
    assert model_cuts(wrapped).whole_only and not model_cuts(loaded.model).whole_only
    # a forward pass gives the same logits as the plain model, and the heads' cache as many entries as the main one
    from mlx_lm.models.cache import BatchKVCache

    cache = wrapped.make_cache()
    tokens = mx.array([[5, 9, 17, 33, 2, 8]])
    assert mx.allclose(wrapped(tokens, cache=cache), loaded.model(tokens), atol=1e-4)
    n = wrapped.layers_main
    assert cache[n].offset == cache[0].offset == 6
    batch = [BatchKVCache.merge([c]) if i < len(cache) - 1 else type(c).merge([c]) for i, c in enumerate(cache)]
    drop_last(batch, [2])
    assert batch[n].offset.tolist() == batch[0].offset.tolist() == [4]


def test_a_checkpoint_without_heads_is_refused_in_engine_mtps_sentence(tmp_path) -> None:
    loaded = _loaded("deepseek-v3")
    problem = mtp_refusal(Path(loaded.path))
    assert problem is not None and problem.startswith("SPECULATIVE=mtp cannot run on MODEL=")
    with pytest.raises(ModelError, match="holds no weights under model.layers.2"):
        with_heads(loaded)
    settings = load_settings({"MODEL": "zoo-deepseek-v3", "SPECULATIVE": "mtp"}, env_file=tmp_path / "none.env")
    with pytest.raises(ModelError, match="^SPECULATIVE=mtp cannot run"):
        MtpProposer(settings, loaded)


def test_an_entry_with_the_heads_kv_and_carry_goes_to_disk_and_back_whole() -> None:
    from engine.diskcache.structure import from_host, host_copy
    from engine.speculative.carry import HiddenCarry

    wrapped = with_heads(_loaded("deepseek-v3-mtp"))
    cache = wrapped.make_cache()
    wrapped(mx.array([[5, 9, 17, 33]]), cache=cache)
    back = from_host(host_copy(cache))
    assert [type(c) for c in back] == [type(c) for c in cache] and isinstance(back[-1], HiddenCarry)
    assert mx.array_equal(back[-1][0], cache[-1][0])
    assert mx.array_equal(back[-2].keys[..., :4, :], cache[-2].keys[..., :4, :])


def test_kv_bits_stores_the_heads_kv_quantized_and_the_heads_chain_only_when_the_plan_says() -> None:
    full, quantized = _loaded("deepseek-v3-wide-mtp-trained"), _loaded("deepseek-v3-wide-mtp-trained")
    install(quantized.model, 8, 64)  # KV_BITS=8, as engine.loading applies it
    wrapped = with_heads(quantized, None, 8, 64)
    # the heads' KV is stored in 8 bits as the main layers', and admission reserves it at that size
    assert measure(quantized.model).token_bytes < measure(wrapped).token_bytes < measure(with_heads(full)).token_bytes
    batch = LockstepBatch(wrapped, set(), 64, 8)
    batch.chain_tokens = 3
    batch.apply(Plan(step=0, fingerprint=0, token_check=0, inserts=[Insert(rid="a", tokens=[5, 9, 17, 33],
                                                                           max_tokens=20)]))
    batch.step()  # the prompt
    batch.step()  # its first decoding step
    assert len(batch.mtp_drafts["a"]) == 4  # the next input, then 3 drafts chained on the quantized heads' cache
    batch.step(chain=False)  # the next plan drafts nothing: no heads' pass, and no stale drafts handed out
    assert batch.mtp_drafts == {}
    batch.step()
    assert len(batch.mtp_drafts["a"]) == 4
