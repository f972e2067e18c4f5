"""A model folder's own Python (a tokenizer class named in auto_map) runs in the multi-rank loads only where
TRUST_REMOTE_CODE says so, as in the one-rank load: driven through engine.sharding.load_parallel with a real
one-rank group, the mode forced (one rank alone would load whole)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from config import load_settings
from tests.harness import MODEL_CACHE


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """zoo-ministral3 (it has both shard() and pipeline()) whose tokenizer_config.json names a tokenizer class in the folder's own marker_tok.py."""
    from engine.zoo import ensure_zoo_model

    out = tmp_path_factory.mktemp("remote") / "model"
    shutil.copytree(ensure_zoo_model("ministral3", MODEL_CACHE), out)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": [None, "marker_tok.MarkerTokenizer"]}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    (out / "marker_tok.py").write_text(
        "from pathlib import Path\n"
        f"Path({str(out.parent / 'RAN')!r}).write_text('the folder code ran')\n"
        "from transformers import PreTrainedTokenizerFast\n"
        "class MarkerTokenizer(PreTrainedTokenizerFast):\n"
        "    pass\n")
    return out


@pytest.mark.parametrize("mode", ["tensor", "pipeline"])
@pytest.mark.parametrize("trust", [False, True])
def test_a_multi_rank_load_runs_the_folders_tokenizer_code_only_when_trust_remote_code_is_on(
        folder: Path, mode: str, trust: bool, monkeypatch, tmp_path):
    import mlx.core as mx
    import transformers.dynamic_module_utils as modules

    import engine.sharding as sharding
    from engine.mlx_compat import hf_tokenizer

    monkeypatch.setattr(modules, "HF_MODULES_CACHE", str(tmp_path / "modules"))  # its copies of the folder's code
    monkeypatch.setattr(sharding, "choose", lambda *args: (mode, ""))
    (folder.parent / "RAN").unlink(missing_ok=True)
    settings = load_settings({"MODEL": str(folder), "TRUST_REMOTE_CODE": str(trust)}, env_file="/nonexistent")
    _, tokenizer, _, layout = sharding.load_parallel(settings, str(folder), mx.distributed.init())

    assert layout.mode == mode
    assert (type(hf_tokenizer(tokenizer)).__name__ == "MarkerTokenizer") is trust
    assert (folder.parent / "RAN").exists() is trust
