"""SPECULATIVE=mtp where mlx-lm cannot run the heads: refused at start in one sentence that says why. A checkpoint
that ships heads loads without them (mlx-lm drops them), so the refusal names mlx-lm; one that ships none says so."""

from __future__ import annotations

import json
import shutil

import pytest

from config import load_settings
from engine.model import LoadedModel, ModelError
from engine.zoo import ensure_zoo_model
from tests.harness import MODEL_CACHE

mx = pytest.importorskip("mlx.core")

from mlx_lm import load as mlx_load  # noqa: E402

from engine.speculative.mtp import MtpProposer, mtp_support, shipped_heads  # noqa: E402

# zoo family -> (the config key its real checkpoints use, an MTP weight named as they name it). Qwen3-Next's
# sanitize() drops the heads only from Hugging Face's layout (experts unstacked): a folder mlx_lm.convert wrote
# keeps the config key and lacks the weights, as the zoo's MLX layout does here. DeepSeek-V3's drops layer 61 by
# number (the real checkpoint's MTP layer), which the zoo's two layers cannot show.
WITH_HEADS = {
    "deepseek-v3": ("num_nextn_predict_layers", None),
    "qwen3.5": ("mtp_num_hidden_layers", "mtp.fc.weight"),
    "qwen3-next": ("mtp_num_hidden_layers", None),
    "glm4-moe": ("num_nextn_predict_layers", "model.layers.{n}.eh_proj.weight"),
}


def _loaded(folder) -> LoadedModel:
    model, tokenizer = mlx_load(str(folder))
    return LoadedModel(model=model, tokenizer=tokenizer, path=str(folder), context_length=4096)


def _with_heads(name: str, tmp_path):
    """The zoo model as its real checkpoint ships: config.json declares one MTP layer and the weights hold it."""
    folder = tmp_path / name
    shutil.copytree(ensure_zoo_model(name, MODEL_CACHE), folder)
    key, weight = WITH_HEADS[name]
    config = json.loads((folder / "config.json").read_text())
    part = config.get("text_config", config) if key in config.get("text_config", {}) else config
    part[key] = 1
    (folder / "config.json").write_text(json.dumps(config))
    if weight is None:
        return folder
    files = sorted(folder.glob("*.safetensors"))
    weights = mx.load(str(files[0]))
    weights[weight.format(n=part.get("num_hidden_layers", 0))] = mx.zeros((4, 4))
    mx.save_safetensors(str(files[0]), weights, metadata={"format": "mlx"})
    return folder


@pytest.mark.parametrize("name", sorted(WITH_HEADS))
def test_heads_a_checkpoint_ships_are_dropped_by_mlx_lm_and_mtp_is_refused(name, tmp_path) -> None:
    folder = _with_heads(name, tmp_path)
    loaded = _loaded(folder)
    assert shipped_heads(folder) == 1
    problem = mtp_support(loaded, "zoo-" + name)
    assert problem is not None and problem.startswith(f"SPECULATIVE=mtp cannot run on MODEL=zoo-{name} (")
    assert "mlx-lm 0.32.2 drops the checkpoint's 1 multi-token-prediction layer(s) (its sanitize() drops" in problem
    assert "SPECULATIVE=ngram" in problem and problem.count(". ") == 0
    settings = load_settings({"MODEL": "zoo-" + name, "SPECULATIVE": "mtp"}, env_file=tmp_path / "none.env")
    with pytest.raises(ModelError, match="^SPECULATIVE=mtp cannot run"):
        MtpProposer(settings, loaded)


@pytest.mark.parametrize("name", ["deepseek-v3", "qwen3.5", "qwen3-next", "glm4-moe", "llama"])
def test_a_zoo_model_that_ships_no_heads_is_refused_for_that(name) -> None:
    loaded = _loaded(ensure_zoo_model(name, MODEL_CACHE))
    problem = mtp_support(loaded, "zoo-" + name)
    assert problem is not None and "its checkpoint ships no multi-token-prediction heads" in problem
