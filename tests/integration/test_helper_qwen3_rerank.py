"""The Qwen3-Reranker-style helper (engine/helpers/families/rerank.py) on zoo-qwen3-reranker: each pair is the
prompt the model card writes, and a batch's scores equal P(yes) = softmax(logit(no), logit(yes))[1] taken from
mlx-lm's own full forward pass over each prompt alone (no padding, the whole vocabulary's logits). No sockets."""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.utils import load_model
from tokenizers import Tokenizer

from engine.helpers.families import encoder, rerank
from engine.load_errors import ModelError
from engine.zoo import ensure_zoo_model
from engine.zoo.store import ensure_helper_model
from tests.harness import MODEL_CACHE

# The card's prompt, written out: the system prefix, the user turn, the assistant's empty think block.
CARD = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
        "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n"
        "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
        "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
WEB = "Given a web search query, retrieve relevant passages that answer the query"
PAIRS = [("What is the capital of China?", "The capital of China is Beijing."),
         ("Explain gravity", "Gravity is a force that attracts two bodies towards each other, the longer text here."),
         ("x", "y")]


@pytest.fixture(scope="module")
def folder():
    return ensure_helper_model("qwen3-reranker", MODEL_CACHE)


@pytest.fixture(scope="module")
def helper(folder):
    return rerank.load(folder, "zoo-qwen3-reranker")


def test_pairs_are_the_cards_prompt(folder, helper):
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for query, document in PAIRS:
        ids = helper.pair_tokens(query, document)
        assert tok.decode(ids, skip_special_tokens=False) == CARD.format(instruction=WEB, query=query, document=document)
    custom = helper.pair_tokens("q", "d", instruction="Given a code question, retrieve code that answers it")
    assert "<Instruct>: Given a code question, retrieve code" in tok.decode(custom, skip_special_tokens=False)
    assert (helper.kind, helper.dimensions, helper.matryoshka, helper.max_tokens) == ("rerank", 0, False, 8192)


def test_limit_cuts_the_document_and_keeps_the_prompts_end(folder, helper):
    full = helper.pair_tokens("query", "word " * 200)
    cut = helper.pair_tokens("query", "word " * 200, limit=len(full) - 50)
    assert len(cut) == len(full) - 50 and cut[-len(helper.suffix):] == helper.suffix
    assert cut[:-len(helper.suffix)] == full[:len(cut) - len(helper.suffix)]


def test_scores_equal_p_yes_from_mlx_lms_full_forward(folder, helper):
    config = json.loads((folder / "config.json").read_text())
    assert config["tie_word_embeddings"] and rerank.matches(config) and not encoder.matches(config)
    model, _ = load_model(folder)
    vocab = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab()
    batch = [helper.pair_tokens(q, d) for q, d in PAIRS]
    assert len({len(row) for row in batch}) == len(batch)  # unequal lengths: the batch is padded
    want = []
    for row in batch:
        logits = np.array(model(mx.array([row]))[0, -1].astype(mx.float32), dtype=np.float64)
        pair = np.array([logits[vocab["no"]], logits[vocab["yes"]]])
        want.append(np.exp(pair[1] - pair.max()) / np.exp(pair - pair.max()).sum())
    got = np.array(helper.score(batch))
    assert got.shape == (len(PAIRS),) and got.dtype == np.float32 and ((got > 0) & (got < 1)).all()
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert max(want) - min(want) > 1e-3  # the pairs score differently: a wrong row would show


def test_a_tokenizer_without_yes_and_no_is_refused(folder, tmp_path):
    other = tmp_path / "chat"
    shutil.copytree(ensure_zoo_model("qwen3", MODEL_CACHE), other)
    with pytest.raises(ModelError, match="has no token 'yes'.*set RERANK_MODEL to a reranker"):
        rerank.load(other, "chat")


def test_an_embedding_folder_of_the_same_architecture_is_refused(folder, tmp_path):
    other = tmp_path / "embedding"
    shutil.copytree(folder, other)  # its tokenizer has "yes" and "no", as Qwen3-Embedding's does
    pooling = {"type": "sentence_transformers.models.Pooling", "path": "1_Pooling", "idx": 1, "name": "1"}
    (other / "modules.json").write_text(json.dumps([pooling]))
    with pytest.raises(ModelError, match="is an embedding model .* set it as EMBEDDING_MODEL"):
        rerank.load(other, "embedding")


def test_an_untied_head_is_read_as_the_4b_and_8b_rerankers_have_one(folder, helper, tmp_path):
    untied = tmp_path / "untied"
    shutil.copytree(folder, untied)
    weights = mx.load(str(untied / "model.safetensors"))
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"] * 0.5  # half the logits of the tied head
    mx.save_safetensors(str(untied / "model.safetensors"), weights)
    config = json.loads((untied / "config.json").read_text()) | {"tie_word_embeddings": False}
    (untied / "config.json").write_text(json.dumps(config))
    batch = [helper.pair_tokens(q, d) for q, d in PAIRS]
    tied, half = np.array(helper.score(batch), np.float64), np.array(rerank.load(untied, "u").score(batch), np.float64)
    np.testing.assert_allclose(np.log(half / (1 - half)), 0.5 * np.log(tied / (1 - tied)), rtol=1e-4)
