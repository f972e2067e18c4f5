"""A model folder that cannot load is named in one sentence (the file, the problem, what to do), without MLX.

Each folder is a small sound one (plain files written here) with one thing broken; what only building the
model tells (shapes, parameter names) is mlx-lm's error text turned into the same kind of sentence.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from config.model_folder import folder_problem
from engine.load_errors import explain
from ops.failures import Observed, blame
from ops.hostprobe import model_facts

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "vocab_size": 1024}


def safetensors(tensors: dict[str, tuple[int, ...]]) -> bytes:
    """A float32 safetensors file with zeroed tensors of these shapes."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        size = 4
        for n in shape:
            size *= n
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(header).encode()
    return struct.pack("<Q", len(head)) + head + bytes(offset)


@pytest.fixture
def folder(tmp_path) -> Path:
    """A folder every check passes: config, one weights file, a tokenizer and its settings."""
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(CONFIG))
    (d / "model.safetensors").write_bytes(safetensors({"model.embed_tokens.weight": (16, 4)}))
    (d / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    return d


def config(d: Path, **changes) -> None:
    (d / "config.json").write_text(json.dumps({**CONFIG, **changes}))


def test_a_sound_folder_passes(folder):
    assert folder_problem(folder) is None


@pytest.mark.parametrize("model_type", ["mistral", "kimi_k2", "deepseek_v3", "lfm2-vl"])
def test_model_types_mlx_lm_knows_pass_including_its_remapped_names(folder, model_type):
    config(folder, model_type=model_type)
    assert folder_problem(folder) is None


def test_config_json_that_is_not_json(folder):
    (folder / "config.json").write_text('{"model_type": "qwen3",\n "hidden_size": 64,,}')
    assert folder_problem(folder) == (f"{folder}/config.json is not valid JSON (Expecting property name enclosed in "
                                      "double quotes at line 2, column 20): restore the config.json that came with "
                                      "the model")


def test_config_json_that_is_not_an_object(folder):
    (folder / "config.json").write_text("[1, 2]")
    assert folder_problem(folder).startswith(f"{folder}/config.json holds a JSON list, not an object")


def test_config_json_without_model_type(folder):
    (folder / "config.json").write_text(json.dumps({"hidden_size": 64}))
    assert folder_problem(folder).startswith(f"{folder}/config.json has no model_type, so mlx-lm cannot tell")


def test_an_unknown_model_type(folder):
    config(folder, model_type="qwen9_turbo")
    problem = folder_problem(folder)
    assert problem.startswith(f"{folder}/config.json names model_type 'qwen9_turbo', which mlx-lm ")
    assert "cannot build (no mlx_lm/models/qwen9_turbo.py): serve a model of an architecture" in problem


def test_no_weights(folder):
    (folder / "model.safetensors").unlink()
    assert folder_problem(folder) == (f"{folder} has no weights (no model*.safetensors file): download or copy the "
                                      "model again")


@pytest.mark.parametrize("name", ["consolidated.safetensors", "pytorch_model.bin"])
def test_weights_mlx_lm_does_not_load_are_named(folder, name):
    (folder / "model.safetensors").rename(folder / name)
    problem = folder_problem(folder)
    assert name in problem and problem.endswith("convert the model with mlx_lm.convert")


def test_a_shard_the_index_names_is_missing(folder):
    (folder / "model.safetensors").rename(folder / "model-00001-of-00003.safetensors")
    weight_map = {"a": "model-00001-of-00003.safetensors", "b": "model-00002-of-00003.safetensors",
                  "c": "model-00003-of-00003.safetensors"}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert folder_problem(folder) == (f"{folder}/model-00002-of-00003.safetensors (and 1 more), named in "
                                      f"{folder}/model.safetensors.index.json, is missing: download or copy the "
                                      "model again")


def test_a_weights_file_cut_short(folder):
    whole = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(whole[:-10])
    assert folder_problem(folder) == (f"{folder}/model.safetensors is cut short ({len(whole) - 10} bytes, its header "
                                      f"lists {len(whole)}): download or copy the model again")


def test_a_weights_file_that_is_not_safetensors(folder):
    (folder / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0\n")
    assert folder_problem(folder).startswith(f"{folder}/model.safetensors is not a safetensors file")


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_a_tokenizer_file_that_is_not_json(folder, name):
    (folder / name).write_text('{"version": "1.0"}{')
    assert folder_problem(folder) == (f"{folder}/{name} is not valid JSON (Extra data at line 1, column 19), so the "
                                      "tokenizer does not load: copy it again from the original model")


def test_no_tokenizer(folder):
    (folder / "tokenizer.json").unlink()
    assert folder_problem(folder).startswith(f"{folder} has no tokenizer (no tokenizer.json, tokenizer.model")


def test_no_tokenizer_config(folder):
    (folder / "tokenizer_config.json").unlink()
    assert folder_problem(folder).startswith(f"{folder}/tokenizer_config.json is missing, so the tokenizer has no "
                                             "settings and no chat template")


def test_check_reports_the_sentence_as_the_hosts_fault(folder):
    (folder / "model.safetensors").unlink()
    facts = model_facts(str(folder), REPO_ROOT)
    assert facts == {"ok": False, "problem": folder_problem(folder)}


# -- what only loading tells: mlx-lm's messages (0.32), as it raises them ---------------------------------------


def test_a_shape_mismatch_names_the_weights_file_the_parameter_and_both_shapes(folder):
    exc = ValueError("Expected shape (1024, 128) but received shape (1024, 64) for parameter model.embed_tokens.weight")
    assert explain(folder, exc) == (
        f"{folder}/model.safetensors does not fit {folder}/config.json: model.embed_tokens.weight has shape (1024, 64) "
        "where the qwen3 model that config.json describes expects (1024, 128); the config was changed after the "
        "weights were made, or they belong to another model: restore the config.json that came with the weights, "
        "or convert the model again (mlx_lm.convert)")


def test_a_shape_mismatch_names_the_shard_the_index_gives(folder):
    index = {"weight_map": {"lm_head.weight": "model-2.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    exc = ValueError("Expected shape (8, 4) but received shape (8, 2) for parameter lm_head.weight")
    assert explain(folder, exc).startswith(f"{folder}/model-2.safetensors does not fit {folder}/config.json")


def test_missing_and_extra_parameters(folder):
    missing = ValueError("Missing 11 parameters: \nmodel.layers.1.input_layernorm.weight,\n"
                         "model.layers.1.mlp.down_proj.weight.")
    assert explain(folder, missing).startswith(
        f"the weights in {folder} lack 11 parameter(s) that the qwen3 model of {folder}/config.json needs (the first: "
        "model.layers.1.input_layernorm.weight)")
    extra = ValueError("Received 1 parameters not in model: \nmodel.layers.9.foo.weight.")
    assert explain(folder, extra).startswith(
        f"{folder}/model.safetensors holds 1 parameter(s) that the qwen3 model of {folder}/config.json does not have "
        "(the first: model.layers.9.foo.weight)")


def test_a_setting_the_model_needs(folder):
    exc = TypeError("ModelArgs.__init__() missing 1 required positional argument: 'num_hidden_layers'")
    assert explain(folder, exc).startswith(f"{folder}/config.json lacks num_hidden_layers, which the qwen3 model needs")


def test_a_tokenizer_that_does_not_build(folder):
    exc = ValueError("Couldn't instantiate the backend tokenizer from one of: \n(1) a `tokenizers` library file")
    assert explain(folder, exc) == (f"the tokenizer in {folder} does not load (Couldn't instantiate the backend "
                                    "tokenizer from one of): copy tokenizer.json and tokenizer_config.json again "
                                    "from the original model")


def test_whatever_the_tokenizer_library_raises_is_the_tokenizers_fault(folder):
    with pytest.raises(KeyError) as raised:  # as transformers raises it on a tokenizer.json of another shape
        exec(compile("{}['added_tokens']", "/venv/site-packages/transformers/tokenization_utils_fast.py", "exec"))
    assert explain(folder, raised.value) == (f"the tokenizer in {folder} does not load (KeyError: 'added_tokens'): "
                                             "copy tokenizer.json and tokenizer_config.json again from the original "
                                             "model")


def test_anything_else_is_named_with_its_folder(folder):
    assert explain(folder, KeyError("rope_theta")) == f"the model in {folder} does not load (KeyError: 'rope_theta')"


# -- the supervisor's verdict carries the sentence ----------------------------------------------------------------


def test_a_rank_that_could_not_load_the_model_has_its_error_line_as_the_reason():
    sentence = "/m/model.safetensors does not fit /m/config.json: restore it"
    observed = Observed(size=2)
    for line in ("2026-11-24 21:03:26,948 rank1 ERROR engine: " + sentence,
                 "\x1b[33m[WARN] Node with rank 1 exited with code 5 \x1b[0m"):
        observed.read(line)
    failure = blame(observed, observed.exited(), "", pgid=0)
    assert (failure.rank, failure.summary, failure.detail) == (1, "rank 1 could not load the model", sentence)
