"""engine/mtp: the checkpoint's multi-token-prediction layers load where vLLM's deepseek_mtp.py and
glm4_moe_mtp.py put them, compute what those compute, split as the main layers do, and a checkpoint without
them is refused in one sentence. Zoo models; no sockets."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import load
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from engine.model import ModelError
from engine.mtp import heads_refusal, load_heads
from engine.zoo import ensure_zoo_model
from tests.harness import MODEL_CACHE

TOKENS = [[17, 230, 45, 600, 88, 91, 402], [5, 6, 7, 8, 9, 10, 11]]


def _raw(folder: Path) -> dict[str, mx.array]:
    weights = {}
    for f in sorted(folder.glob("*.safetensors")):
        weights.update(mx.load(str(f)))
    return weights


def _reference(folder: Path, model, hidden: mx.array, tokens: mx.array) -> tuple[mx.array, mx.array]:
    """The reference formula over the raw tensors: e = enorm(embed(x)) (zero at position 0), g = hnorm(h),
    x = block(eh_proj([e, g])), logits = head(shared_head.norm(x)); the block loaded by mlx-lm as a main layer
    of a model one layer deeper."""
    raw = _raw(folder)
    args = model.args
    n = args.num_hidden_layers
    p = f"model.layers.{n}."
    deeper = type(model)(type(args).from_dict({**vars(args), "num_hidden_layers": n + 1}))
    own = ("enorm", "hnorm", "eh_proj", "shared_head", "embed_tokens")
    block = {k: v for k, v in raw.items() if k.startswith(p) and k[len(p):].split(".")[0] not in own}
    block = {k[len(p):]: v for k, v in deeper.sanitize(block).items()}
    layer = deeper.model.layers[n]
    layer.load_weights(list(block.items()), strict=True)
    eps = args.rms_norm_eps
    e = raw.get(p + "embed_tokens.weight", raw["model.embed_tokens.weight"])[tokens]
    e = mx.concatenate([mx.zeros_like(e[:, :1]), e[:, 1:]], axis=1)
    x = mx.concatenate([mx.fast.rms_norm(e, raw[p + "enorm.weight"], eps),
                        mx.fast.rms_norm(hidden, raw[p + "hnorm.weight"], eps)], axis=-1) @ raw[p + "eh_proj.weight"].T
    mask = create_attention_mask(x, None, return_array=True)
    x = layer(x, mask, KVCache())
    head = raw.get(p + "shared_head.head.weight", raw["lm_head.weight"])
    return x, mx.fast.rms_norm(x, raw[p + "shared_head.norm.weight"], eps) @ head.T


@pytest.mark.parametrize("name", ["deepseek-v3-mtp", "glm4-moe-mtp"])
def test_heads_load_where_the_reference_puts_them_and_compute_its_formula(name):
    folder = ensure_zoo_model(name, MODEL_CACHE)
    model, _ = load(str(folder))  # mlx-lm's own load still works: it never sees the heads
    heads = load_heads(model, folder)
    assert heads.depths == 1
    tokens = mx.array(TOKENS)
    hidden = model.model(tokens)
    want_x, want_logits = _reference(folder, model, hidden, tokens)
    # at once, then the last position alone from the cache the first ones left (as a decode step)
    x, logits = heads(hidden, tokens, heads.make_cache())
    cache = heads.make_cache()
    heads(hidden[:, :-1], tokens[:, :-1], cache)
    last_x, last_logits = heads(hidden[:, -1:], tokens[:, -1:], cache)
    assert cache[0].offset == len(TOKENS[0])
    for got, want in ((x, want_x), (logits, want_logits), (last_x, want_x[:, -1:]), (last_logits, want_logits[:, -1:])):
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-4)


class _Group:
    """What mlx-lm's shard() asks of a group while splitting weights (the collectives run only in a forward)."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


@pytest.mark.parametrize("name", ["deepseek-v3-mtp", "glm4-moe-mtp", "qwen3.5-mtp", "qwen3.5-moe-mtp"])
def test_heads_split_over_two_ranks_exactly_as_a_main_moe_layer(name):
    from mlx.utils import tree_flatten

    folder = ensure_zoo_model(name, MODEL_CACHE)
    for rank in (0, 1):
        model, _ = load(str(folder))
        heads = load_heads(model, folder)
        whole = dict(tree_flatten(heads.layers[0].mtp_block.parameters()))
        heads.shard(_Group(rank, 2))
        model.shard(_Group(rank, 2))
        split = dict(tree_flatten(heads.layers[0].mtp_block.parameters()))
        # the last main layer: MoE as DeepSeek's and GLM's blocks; full attention as Qwen3.5's (MoE as well)
        main = dict(tree_flatten(model.model.layers[-1].parameters()))
        assert {k: v.shape for k, v in split.items()} == {k: v.shape for k, v in main.items()}
        assert any(split[k].shape != whole[k].shape for k in split)
        # rank r holds the r-th half of each split projection, as shard_linear cuts a main layer's
        for k, v in split.items():
            if v.shape != whole[k].shape:
                axis = next(i for i, (a, b) in enumerate(zip(v.shape, whole[k].shape)) if a != b)
                part = np.split(np.array(whole[k]), 2, axis=axis)[rank]
                np.testing.assert_array_equal(np.array(v), part)
        counts = [{k: v for k, v in vars(m.self_attn).items() if type(v) is int}
                  for m in (heads.layers[0].mtp_block, model.model.layers[-1])]
        assert counts[0] == counts[1]  # heads per rank


@pytest.mark.parametrize("name", ["deepseek-v3-mtp", "glm4-moe-mtp", "qwen3-next-mtp", "qwen3.5-mtp"])
def test_the_last_pipeline_stage_builds_the_heads_beside_its_own_layers_and_they_compute_as_on_the_whole_model(name):
    # mlx-lm's pipeline() leaves rank 0 (the last stage) its last layers only, the others None; the heads read the
    # final hidden state, the embedding and the lm_head, which that stage holds
    folder = ensure_zoo_model(name, MODEL_CACHE)
    model, _ = load(str(folder))
    tokens = mx.array(TOKENS)
    hidden = model.model(tokens)
    want = load_heads(model, folder)(hidden, tokens, None)
    stage, _ = load(str(folder))
    stage.model.pipeline(_Group(0, 2))
    assert stage.model.layers[0] is None
    got = load_heads(stage, folder)(hidden, tokens, None)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.array(g), np.array(w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("name", "says"), [
    ("deepseek-v3", "its checkpoint holds no weights under model.layers.2.*"),
    ("deepseek-v3-4bit", "mlx_lm.convert drops the heads when it quantizes"),
    ("qwen3", "no multi-token-prediction module here follows this architecture"),
    ("qwen3-next", "its checkpoint holds no weights under mtp.*"),
    ("qwen3.5", "its checkpoint holds no weights under mtp.*"),
])
def test_a_checkpoint_without_heads_is_refused_in_one_sentence(name, says):
    folder = ensure_zoo_model(name, MODEL_CACHE)
    sentence = heads_refusal(folder)
    assert sentence is not None and says in sentence and sentence.count(". ") == 0
    model, _ = load(str(folder))
    with pytest.raises(ModelError) as refused:
        load_heads(model, folder)
    assert str(refused.value) == sentence


def test_the_trained_zoo_head_predicts_the_main_models_next_next_token_on_unseen_prompts():
    """What makes drafts accepted: loaded from its files as the engine loads it, the head trained at build time
    agrees with the model's own greedy token two positions on, on prompts drawn apart from its training data."""
    import json

    from engine.zoo.mtp_train import PROMPT_TOKENS, agreement, continuations, pairs

    folder = ensure_zoo_model("deepseek-v3-mtp-trained", MODEL_CACHE)
    model, _ = load(str(folder))
    heads = load_heads(model, folder)
    prompts = mx.array(np.random.default_rng(2026).integers(100, 1000, size=(8, PROMPT_TOKENS)))
    unseen = agreement(heads, *pairs(model, continuations(model, prompts, 24)))
    assert unseen >= 0.5
    assert json.loads((folder / "zoo-model.json").read_text())["mtp"]["held_out_agreement"] >= 0.5
    untrained = load_heads(model, ensure_zoo_model("deepseek-v3-mtp", MODEL_CACHE))
    assert agreement(untrained, *pairs(model, continuations(model, prompts, 24))) < 0.1
