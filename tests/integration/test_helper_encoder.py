"""BERT-style helpers (engine/helpers/families/encoder.py, the cross-encoder of rerank.py) on the zoo's folders
give what a plain numpy BERT computes from the same safetensors, one unpadded input at a time, with the
folder's tokenizer.json run by `tokenizers` itself: embeddings pooled and normalized as the
sentence-transformers files say, cross-encoder scores as sigmoid(classifier(pooler)). No sockets."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from engine.helpers.families import encoder, rerank
from engine.load_errors import ModelError
from engine.zoo.store import ensure_helper_model
from tests.encoder_reference import bert, pool
from tests.harness import MODEL_CACHE

TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog, twice!", "a", "Numbers: 3.14 and 42."]
def _cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.fixture(scope="module")
def embedding_folder():
    return ensure_helper_model("bert-embedding", MODEL_CACHE)


def _reference(folder, mode: str, normalize: bool) -> np.ndarray:
    cfg = json.loads((folder / "config.json").read_text())
    w, tok = load_file(str(folder / "model.safetensors")), Tokenizer.from_file(str(folder / "tokenizer.json"))
    rows = []
    for text in TEXTS:
        ids = tok.encode(text).ids
        rows.append(pool(bert(w, cfg, ids, [0] * len(ids)), mode))
    rows = np.stack(rows)
    return rows / np.linalg.norm(rows, axis=-1, keepdims=True) if normalize else rows


def test_embeddings_equal_a_numpy_bert_with_mean_pooling_and_normalize(embedding_folder):
    helper = encoder.load(embedding_folder, "zoo-bert-embedding")
    tok = Tokenizer.from_file(str(embedding_folder / "tokenizer.json"))
    batch = [helper.tokenize(t) for t in TEXTS]
    assert batch == [tok.encode(t).ids for t in TEXTS]
    assert all(row[0] == tok.token_to_id("[CLS]") and row[-1] == tok.token_to_id("[SEP]") for row in batch)
    got = np.array(helper.embed(batch))
    assert got.shape == (len(TEXTS), 64) and got.dtype == np.float32
    assert _cosines(got, _reference(embedding_folder, "mean", True)).min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, atol=1e-5)
    assert (helper.kind, helper.dimensions, helper.matryoshka, helper.max_tokens) == ("embedding", 64, False, 96)
    assert helper.weight_bytes() == sum(v.nbytes for v in load_file(str(embedding_folder / "model.safetensors")).values())


@pytest.mark.parametrize("mode", ["cls", "max", "mean_sqrt_len"])
def test_pooling_mode_and_no_normalize_follow_the_folder(embedding_folder, tmp_path, mode):
    folder = tmp_path / "model"
    shutil.copytree(embedding_folder, folder)
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    pooling = {k: (k == f"pooling_mode_{mode}_token" or k == f"pooling_mode_{mode}_tokens") if k.startswith(
        "pooling_mode_") else v for k, v in pooling.items()}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    modules = [m for m in json.loads((folder / "modules.json").read_text()) if not m["type"].endswith("Normalize")]
    (folder / "modules.json").write_text(json.dumps(modules))
    helper = encoder.load(folder, "m")
    got = np.array(helper.embed([helper.tokenize(t) for t in TEXTS]))
    want = _reference(folder, mode, normalize=False)
    assert _cosines(got, want).min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), np.linalg.norm(want, axis=-1), rtol=1e-3)
    assert np.abs(np.linalg.norm(got, axis=-1) - 1.0).max() > 0.01  # not normalized


def test_max_tokens_falls_back_to_the_position_table(embedding_folder, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(embedding_folder, folder)
    (folder / "sentence_bert_config.json").unlink()
    assert encoder.load(folder, "m").max_tokens == 128


def test_cross_encoder_scores_equal_sigmoid_of_a_numpy_classifier():
    folder = ensure_helper_model("bert-rerank", MODEL_CACHE)
    cfg = json.loads((folder / "config.json").read_text())
    assert rerank.matches(cfg) and not encoder.matches(cfg)
    helper = rerank.load(folder, "zoo-bert-rerank")
    assert (helper.kind, helper.dimensions, helper.max_tokens) == ("rerank", 0, 128)
    w, tok = load_file(str(folder / "model.safetensors")), Tokenizer.from_file(str(folder / "tokenizer.json"))
    pairs = [("what is a fox", TEXTS[1]), ("numbers", TEXTS[3]), ("hello", "a")]
    batch = [helper.pair_tokens(q, d) for q, d in pairs]
    want = []
    for q, d in pairs:
        enc = tok.encode(q, d)  # [CLS] q [SEP] d [SEP], the document's segment 1
        hidden = bert(w, cfg, enc.ids, enc.type_ids, prefix="bert.")
        pooled = np.tanh(hidden[0] @ w["bert.pooler.dense.weight"].T + w["bert.pooler.dense.bias"])
        want.append(1.0 / (1.0 + np.exp(-(pooled @ w["classifier.weight"].T + w["classifier.bias"])[0])))
        assert batch[len(want) - 1] == enc.ids
    np.testing.assert_allclose(np.array(helper.score(batch)), want, atol=1e-5)
    cut = helper.pair_tokens("what is a fox", TEXTS[1] * 4, limit=20)
    assert len(cut) == 20 and cut[-1] == tok.token_to_id("[SEP]")
    # the longest query that leaves a document room: the document is cut to fit, never past the position table nor
    # into an error of the tokenizer's; one word more and the query is refused
    from engine.rank0.errors import Refused
    from engine.rank0.helper_desk import fit_pairs

    def query(n: int) -> str:
        return " ".join(["fox"] * n)
    n = max(n for n in range(1, helper.max_tokens) if len(helper.pair_tokens(query(n), "x")) <= helper.max_tokens)
    (tight,) = fit_pairs(helper, query(n), [TEXTS[1] * 4], truncate=True, per_doc=0)
    head = helper.pair_tokens(query(n), "x")[:-2]  # [CLS] query [SEP]
    assert len(tight) == helper.max_tokens and tight[:len(head)] == head
    with pytest.raises(Refused, match="shorten the query"):
        fit_pairs(helper, query(n + 1), ["a"], truncate=True, per_doc=0)


def test_a_quantized_conversion_is_refused_with_the_fix(embedding_folder, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(embedding_folder, folder)
    config = json.loads((folder / "config.json").read_text()) | {"quantization": {"group_size": 64, "bits": 4}}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="describes quantized weights.*original Hugging Face folder"):
        encoder.load(folder, "q")
