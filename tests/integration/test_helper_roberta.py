"""XLM-RoBERTa-style helpers (bge-m3, multilingual-e5, bge-reranker-v2-m3) through the encoder and rerank
families: positions counted from padding_idx + 1, one token type, and RobertaClassificationHead for a
cross-encoder, checked against the numpy BertModel fed those positions. The folders are zoo-bert-embedding's
tensors rearranged as XLMRobertaModel / XLMRobertaForSequenceClassification checkpoints hold them. No sockets."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer

from engine.helpers.families import encoder, rerank
from engine.load_errors import ModelError
from engine.zoo.store import ensure_helper_model
from tests.encoder_reference import bert
from tests.harness import MODEL_CACHE

PAD = 1  # XLM-RoBERTa's padding_idx: positions start at 2
TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog, twice!"]


def _roberta(tmp_path, classifier: bool):
    src = ensure_helper_model("bert-embedding", MODEL_CACHE)
    folder = tmp_path / "model"
    shutil.copytree(src, folder)
    cfg = json.loads((src / "config.json").read_text())
    positions = cfg["max_position_embeddings"] + PAD + 1
    cfg |= {"model_type": "xlm-roberta", "pad_token_id": PAD, "type_vocab_size": 1,
            "max_position_embeddings": positions,
            "architectures": ["XLMRobertaForSequenceClassification" if classifier else "XLMRobertaModel"]}
    w = load_file(str(src / "model.safetensors"))
    rng = np.random.default_rng(7)
    w["embeddings.position_embeddings.weight"] = rng.normal(0, 1, (positions, cfg["hidden_size"])).astype(np.float32)
    w["embeddings.token_type_embeddings.weight"] = w["embeddings.token_type_embeddings.weight"][:1]
    if classifier:  # no pooler: RobertaClassificationHead reads <s> itself
        w = {"roberta." + k: v for k, v in w.items() if not k.startswith("pooler.")}
        for name, shape in (("dense", (cfg["hidden_size"], cfg["hidden_size"])), ("out_proj", (1, cfg["hidden_size"]))):
            w[f"classifier.{name}.weight"] = rng.normal(0, 0.2, shape).astype(np.float32)
            w[f"classifier.{name}.bias"] = rng.normal(0, 0.05, shape[:1]).astype(np.float32)
        cfg |= {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}
        (folder / "modules.json").unlink()
    save_file(w, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder, cfg, w, Tokenizer.from_file(str(folder / "tokenizer.json"))


def test_embeddings_count_positions_from_padding_idx_plus_one(tmp_path):
    folder, cfg, w, tok = _roberta(tmp_path, classifier=False)
    helper = encoder.load(folder, "xlmr")
    got = np.array(helper.embed([helper.tokenize(t) for t in TEXTS]), dtype=np.float64)
    want = np.stack([bert(w, cfg, tok.encode(t).ids, [0] * len(tok.encode(t).ids), first_position=PAD + 1).mean(0)
                     for t in TEXTS])
    want /= np.linalg.norm(want, axis=-1, keepdims=True)
    assert ((got * want).sum(-1) / np.linalg.norm(got, axis=-1)).min() >= 0.9999
    (folder / "sentence_bert_config.json").unlink()
    assert encoder.load(folder, "xlmr").max_tokens == cfg["max_position_embeddings"] - PAD - 1


def test_cross_encoder_uses_robertas_classification_head(tmp_path):
    folder, cfg, w, tok = _roberta(tmp_path, classifier=True)
    assert rerank.matches(cfg) and not encoder.matches(cfg)
    helper = rerank.load(folder, "xlmr-rerank")
    pairs = [("what is a fox", TEXTS[1]), ("hello", "a")]
    batch = [helper.pair_tokens(q, d) for q, d in pairs]
    want = []
    for ids in batch:
        first = bert(w, cfg, ids, [0] * len(ids), prefix="roberta.", first_position=PAD + 1)[0]
        x = np.tanh(first @ w["classifier.dense.weight"].T + w["classifier.dense.bias"])
        want.append(1.0 / (1.0 + np.exp(-(x @ w["classifier.out_proj.weight"].T + w["classifier.out_proj.bias"])[0])))
    np.testing.assert_allclose(np.array(helper.score(batch)), want, atol=1e-5)
    assert helper.max_tokens == cfg["max_position_embeddings"] - PAD - 1


@pytest.mark.parametrize("drop", ["classifier.out_proj.weight", "roberta.encoder.layer.1.output.dense.weight"])
def test_a_checkpoint_missing_a_tensor_is_refused_naming_it(tmp_path, drop):
    folder, cfg, w, tok = _roberta(tmp_path, classifier=True)
    save_file({k: v for k, v in w.items() if k != drop}, str(folder / "model.safetensors"))
    with pytest.raises(ModelError, match=r"lack 1 tensor\(s\) .*\(" + drop.removeprefix("roberta.").replace(".", r"\.")):
        rerank.load(folder, "broken")
