"""An embedding folder's sentence-transformers files decide its pooling, normalization and longest input
(engine/helpers/st_folder.py), and files it cannot honour are refused with the fix, at load."""

from __future__ import annotations

import json

import pytest

from engine.helpers.st_folder import Embedding, max_tokens, pools_embeddings, read_embedding
from engine.load_errors import ModelError

TRANSFORMER = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}
POOLING = {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
NORMALIZE = {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
FLAGS = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")


def _folder(tmp_path, modules=None, pooling=None, max_seq=None):
    if modules is not None:
        (tmp_path / "modules.json").write_text(json.dumps(modules))
    if pooling is not None:
        (tmp_path / "1_Pooling").mkdir()
        (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    if max_seq is not None:
        (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq}))
    return tmp_path


def _flags(*on):
    return {"word_embedding_dimension": 384} | {f"pooling_mode_{f}": f in on for f in FLAGS}


@pytest.mark.parametrize(("flag", "mode"), [("cls_token", "cls"), ("mean_tokens", "mean"), ("max_tokens", "max"),
                                            ("mean_sqrt_len_tokens", "mean_sqrt_len"), ("lasttoken", "lasttoken")])
def test_pooling_follows_the_pooling_config(tmp_path, flag, mode):
    folder = _folder(tmp_path, [TRANSFORMER, POOLING], _flags(flag))
    assert read_embedding(folder) == Embedding(pooling=mode, normalize=False)


def test_normalize_module_normalizes_and_max_seq_length_is_read(tmp_path):
    folder = _folder(tmp_path, [TRANSFORMER, POOLING, NORMALIZE], _flags("cls_token"), max_seq=256)
    assert read_embedding(folder) == Embedding(pooling="cls", normalize=True, max_seq_length=256)


def test_newer_pooling_mode_key(tmp_path):
    folder = _folder(tmp_path, [TRANSFORMER, POOLING], {"word_embedding_dimension": 8, "pooling_mode": "cls"})
    assert read_embedding(folder).pooling == "cls"


def test_plain_hugging_face_folder_gets_sentence_transformers_default(tmp_path):
    assert read_embedding(tmp_path) == Embedding(pooling="mean", normalize=False, max_seq_length=None)


@pytest.mark.parametrize(("pooling", "says"), [
    (_flags("cls_token", "mean_tokens"), "turns on 2 pooling modes (cls, mean)"),
    (_flags(), "turns on 0 pooling modes (none)"),
    (_flags("weightedmean_tokens"), "asks for weightedmean pooling"),
])
def test_pooling_it_cannot_honour_is_refused(tmp_path, pooling, says):
    with pytest.raises(ModelError, match=r".*1_Pooling/config.json " + says.replace("(", r"\(").replace(")", r"\)")):
        read_embedding(_folder(tmp_path, [TRANSFORMER, POOLING], pooling))


def test_a_dense_module_is_refused_not_skipped(tmp_path):
    dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    with pytest.raises(ModelError, match="lists a sentence_transformers.models.Dense module"):
        read_embedding(_folder(tmp_path, [TRANSFORMER, POOLING, dense], _flags("mean_tokens")))


def test_broken_json_names_the_file(tmp_path):
    (tmp_path / "modules.json").write_text("[{")
    with pytest.raises(ModelError, match="modules.json is not valid JSON"):
        read_embedding(tmp_path)


@pytest.mark.parametrize(("max_seq", "offset", "expected"), [(None, 0, 512), (256, 0, 256), (None, 2, 512),
                                                              (8192, 2, 512)])
def test_max_tokens_is_the_folders_cap_within_the_position_table(max_seq, offset, expected):
    assert max_tokens({"max_position_embeddings": 512 + offset}, max_seq, offset) == expected


def test_an_embedding_folder_is_told_from_a_reranker_by_its_pooling_module(tmp_path):
    assert not pools_embeddings(tmp_path)
    assert pools_embeddings(_folder(tmp_path, [TRANSFORMER, POOLING, NORMALIZE], _flags("lasttoken")))
