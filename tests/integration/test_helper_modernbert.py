"""ModernBERT helpers (engine/helpers/modernbert.py through the encoder and rerank families) on the zoo's folders
give what a plain numpy ModernBertModel computes from the same safetensors, one unpadded input at a time: inputs
longer than the local window, so local and global layers differ. No sockets."""

from __future__ import annotations

import json

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from engine.helpers.families import encoder, rerank
from engine.zoo.store import ensure_helper_model
from tests.encoder_reference import ERF, layer_norm, modernbert
from tests.harness import MODEL_CACHE

TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog, twice, and then once more for luck!",
         "Numbers: 3.14 and 42."]
PAIRS = [("what is a fox", TEXTS[1]), ("numbers", TEXTS[2]), ("hello", "a")]


def _read(name: str):
    folder = ensure_helper_model(name, MODEL_CACHE)
    cfg = json.loads((folder / "config.json").read_text())
    return folder, cfg, load_file(str(folder / "model.safetensors")), Tokenizer.from_file(str(folder / "tokenizer.json"))


def test_embeddings_equal_a_numpy_modernbert():
    folder, cfg, w, tok = _read("modernbert-embedding")
    assert encoder.matches(cfg) and not rerank.matches(cfg)
    helper = encoder.load(folder, "zoo-modernbert-embedding")
    batch = [helper.tokenize(t) for t in TEXTS]
    assert batch == [tok.encode(t).ids for t in TEXTS]
    assert max(map(len, batch)) > 2 * cfg["local_attention"]  # past the local window
    want = np.stack([modernbert(w, cfg, ids).mean(0) for ids in batch])
    want /= np.linalg.norm(want, axis=-1, keepdims=True)
    got = np.array(helper.embed(batch), dtype=np.float64)
    cosines = (got * want).sum(-1) / np.linalg.norm(got, axis=-1)
    assert cosines.min() >= 0.9999
    assert (helper.dimensions, helper.max_tokens) == (cfg["hidden_size"], 96)


def test_cross_encoder_scores_equal_a_numpy_modernbert_classifier():
    folder, cfg, w, tok = _read("modernbert-rerank")
    assert rerank.matches(cfg) and not encoder.matches(cfg)
    helper = rerank.load(folder, "zoo-modernbert-rerank")
    batch = [helper.pair_tokens(q, d) for q, d in PAIRS]
    assert batch == [tok.encode(q, d).ids for q, d in PAIRS]
    want = []
    for ids in batch:
        pooled = modernbert(w, cfg, ids, prefix="model.").mean(0)  # classifier_pooling "mean"
        h = pooled @ w["head.dense.weight"].T
        h = layer_norm(0.5 * h * (1.0 + ERF(h / np.sqrt(2.0))), w["head.norm.weight"], 0.0, cfg["norm_eps"])
        want.append(1.0 / (1.0 + np.exp(-(h @ w["classifier.weight"].T + w["classifier.bias"])[0])))
    np.testing.assert_allclose(np.array(helper.score(batch)), want, atol=1e-5)
    assert helper.max_tokens == cfg["max_position_embeddings"]
