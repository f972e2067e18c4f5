"""engine/mtp for Qwen3-Next and Qwen3.5: mtp.* loads where vLLM's qwen3_next_mtp.py and qwen3_5_mtp.py put it and
computes what those compute, from a raw Hugging Face checkpoint (zero-centred norms) and from one whose norms were
shifted already. Zoo models; no sockets."""

from __future__ import annotations

import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm import load
from mlx_lm.models.cache import KVCache

from engine.mtp import load_heads
from engine.zoo import ensure_zoo_model
from tests.harness import MODEL_CACHE

TOKENS = [[17, 230, 45, 600, 88, 91, 402], [5, 6, 7, 8, 9, 10, 11]]
NAMES = ["qwen3-next-mtp", "qwen3.5-mtp", "qwen3.5-moe-mtp"]


def _raw(folder: Path) -> dict[str, mx.array]:
    weights = {}
    for f in sorted(folder.glob("*.safetensors")):
        weights.update(mx.load(str(f)))
    return weights


def _rms(x: mx.array, zero_centred: mx.array, eps: float) -> mx.array:
    """Qwen's RMSNorm as Hugging Face defines it: scale 1 + w."""
    return mx.fast.rms_norm(x, 1.0 + zero_centred, eps)


def _reference(folder: Path, model, hidden: mx.array, tokens: mx.array) -> tuple[mx.array, mx.array]:
    """The reference over the raw tensors: e = pre_fc_norm_embedding(embed(x)) (zero at position 0, where no hidden
    precedes), g = pre_fc_norm_hidden(h), x = norm(layer(fc([e, g]))), logits = lm_head(x); the layer mlx-lm's
    full-attention decoder layer of the family, given the checkpoint's tensors (experts stacked, Qwen3.5-MoE's
    gate_up_proj split in halves, norms 1 + w)."""
    raw = _raw(folder)
    lm = getattr(model, "language_model", model)
    args = lm.args
    eps = args.rms_norm_eps
    block = type(model.model.layers[0])(args, args.full_attention_interval - 1)
    assert not block.is_linear
    p = "mtp.layers.0."
    weights, experts = {}, {}
    for name, value in raw.items():
        if not name.startswith(p):
            continue
        rest = name[len(p):]
        if rest.endswith("experts.gate_up_proj"):
            gate, up = mx.split(value, 2, axis=-2)
            weights |= {"mlp.switch_mlp.gate_proj.weight": gate, "mlp.switch_mlp.up_proj.weight": up}
        elif rest.endswith("experts.down_proj"):
            weights["mlp.switch_mlp.down_proj.weight"] = value
        elif ".experts." in rest:
            head, tail = rest.split(".experts.")
            e, proj = tail.split(".", 1)
            experts.setdefault(f"{head}.switch_mlp.{proj}", {})[int(e)] = value
        else:
            weights[rest] = value + 1.0 if rest.endswith(("layernorm.weight", "_norm.weight")) else value
    weights |= {k: mx.stack([v[e] for e in sorted(v)]) for k, v in experts.items()}
    block.load_weights(list(weights.items()), strict=True)
    embed = raw.get("model.embed_tokens.weight", raw.get("model.language_model.embed_tokens.weight"))
    e = embed[tokens]
    e = mx.concatenate([mx.zeros_like(e[:, :1]), e[:, 1:]], axis=1)
    x = mx.concatenate([_rms(e, raw["mtp.pre_fc_norm_embedding.weight"], eps),
                        _rms(hidden, raw["mtp.pre_fc_norm_hidden.weight"], eps)], axis=-1) @ raw["mtp.fc.weight"].T
    x = _rms(block(x, "causal", KVCache()), raw["mtp.norm.weight"], eps)
    return x, x @ raw["lm_head.weight"].T


def _compare(heads, hidden: mx.array, tokens: mx.array, want_x: mx.array, want_logits: mx.array) -> None:
    """At once, then the last position alone from the cache the first ones left (as a decode step)."""
    x, logits = heads(hidden, tokens, heads.make_cache())
    cache = heads.make_cache()
    heads(hidden[:, :-1], tokens[:, :-1], cache)
    last_x, last_logits = heads(hidden[:, -1:], tokens[:, -1:], cache)
    assert cache[0].offset == tokens.shape[1]
    for got, want in ((x, want_x), (logits, want_logits), (last_x, want_x[:, -1:]), (last_logits, want_logits[:, -1:])):
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_qwen_heads_load_from_a_raw_checkpoint_and_compute_the_reference_formula(name, tmp_path):
    folder = ensure_zoo_model(name, MODEL_CACHE)
    model, _ = load(str(folder))  # mlx-lm loads the raw checkpoint itself: its sanitize drops mtp.*
    heads = load_heads(model, folder)
    assert heads.depths == 1
    tokens = mx.array(TOKENS)
    hidden = model.model(tokens)
    want = _reference(folder, model, hidden, tokens)
    _compare(heads, hidden, tokens, *want)

    # the same model converted (main layers in mlx-lm's form, every norm shifted already): heads in a file of
    # their own beside it, norms shifted and experts one by one, load to the same module, not shifted twice
    converted = tmp_path / "converted"
    shutil.copytree(folder, converted)
    mx.save_safetensors(str(converted / "model.safetensors"), dict(tree_flatten(model.parameters())))
    heads_file = {}
    for k, v in tree_flatten(heads.layers[0].parameters()):
        k = "mtp." + k.replace("mtp_block.", "layers.0.")
        if ".switch_mlp." in k:
            heads_file |= {k.replace(".switch_mlp.", f".experts.{e}."): v[e] for e in range(v.shape[0])}
        else:
            heads_file[k] = v
    mx.save_safetensors(str(converted / "mtp.safetensors"), heads_file)
    again, _ = load(str(converted))
    _compare(load_heads(again, converted), hidden, tokens, *want)
