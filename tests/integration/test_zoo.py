"""The model zoo: every family generates reproducibly, loads with mlx-lm, holds its own cache kinds,
and decodes varied greedy tokens; the 4-bit ones are quantized as mlx_lm.convert writes them."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.zoo import FAMILIES, MARKER_FILE, ZOO_MODELS, ensure_zoo_model, zoo_model_path
from engine.zoo.names import ARCH_MODELS
from tests.harness import MODEL_CACHE, REPO

# What mlx-lm 0.32's make_prompt_cache builds per layer: the cache kinds the engine must handle.
# DeepSeek-V3's MLA keeps its latent in a plain KVCache (checked apart below).
CACHE_KINDS = {
    "llama": ["KVCache"] * 2,
    "qwen3": ["KVCache"] * 2,
    "qwen3-moe": ["KVCache"] * 2,
    "qwen3.5": ["ArraysCache"] * 3 + ["KVCache"],
    "qwen3-next": ["ArraysCache"] * 3 + ["KVCache"],
    "deepseek-v3": ["KVCache"] * 2,
    "gpt-oss": ["RotatingKVCache", "KVCache"],
    "glm4-moe": ["KVCache"] * 2,
    "ministral3": ["RotatingKVCache", "KVCache"],
}
PROMPT = [{"role": "user", "content": "Tell me a story about a cluster of Macs. " * 2}]


def _digests(path: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}


@pytest.fixture(scope="session")
def zoo() -> dict[str, Path]:
    """Every zoo model in the tests' shared cache, generated through the CLI when missing."""
    r = subprocess.run([sys.executable, "-m", "engine.zoo", "--cache-dir", str(MODEL_CACHE)], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    paths = [Path(line) for line in r.stdout.splitlines()]
    assert paths == [zoo_model_path(name, MODEL_CACHE) for name in ZOO_MODELS]
    return dict(zip(ZOO_MODELS, paths))


def test_every_family_has_its_cache_kinds_listed() -> None:
    assert sorted(CACHE_KINDS) == sorted(FAMILIES)


def test_the_cli_lists_the_names_and_refuses_an_unknown_one() -> None:
    r = subprocess.run([sys.executable, "-m", "engine.zoo", "--list"], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.split() == ["zoo-" + n for n in ZOO_MODELS]
    r = subprocess.run([sys.executable, "-m", "engine.zoo", "zoo-gpt5"], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "zoo-gpt5" in r.stderr and "zoo-qwen3.5-4bit" in r.stderr


def test_generation_is_byte_identical(zoo: dict[str, Path], tmp_path: Path) -> None:
    for name, path in zoo.items():
        again = ensure_zoo_model(name, tmp_path)
        assert _digests(again) == _digests(path), name


@pytest.mark.parametrize("name", ARCH_MODELS)
def test_loads_with_its_cache_kinds_and_decodes_greedily(zoo: dict[str, Path], name: str) -> None:
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    model, tokenizer = load(str(zoo[name]))
    family = name.removesuffix("-4bit")
    cache = make_prompt_cache(model)
    assert [type(c).__name__ for c in cache] == CACHE_KINDS[family]
    config = json.loads((zoo[name] / "config.json").read_text())
    window = config.get("sliding_window")
    for c in cache:
        if type(c).__name__ == "RotatingKVCache":
            assert c.max_size == window == 32

    prompt = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True)
    assert len(prompt) > 32  # longer than the sliding windows
    logits = model(mx.array(prompt)[None], cache=cache)
    tokens = []
    for _ in range(32):
        tokens.append(int(mx.argmax(logits[0, -1]).item()))
        logits = model(mx.array([tokens[-1:]]), cache=cache)
    # Random weights, but not a model stuck on one token: the engine's tests need varied text.
    assert len(set(tokens)) >= 16, tokens
    if family == "deepseek-v3":
        # MLA: one latent of kv_lora_rank and one shared RoPE key per token, not per-head keys and values.
        assert cache[0].keys.shape[1:] == (1, cache[0].keys.shape[2], config["kv_lora_rank"])
        assert cache[0].values.shape[-1] == config["qk_rope_head_dim"]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_4bit_config_is_what_mlx_lm_writes(zoo: dict[str, Path], family: str) -> None:
    plain = json.loads((zoo[family] / "config.json").read_text())
    quantized = json.loads((zoo[family + "-4bit"] / "config.json").read_text())
    assert "quantization" not in plain
    assert quantized["quantization"] == quantized["quantization_config"]
    assert {k: quantized["quantization"][k] for k in ("group_size", "bits", "mode")} == \
        {"group_size": 64, "bits": 4, "mode": "affine"}
    assert {k: v for k, v in quantized.items() if not k.startswith("quantization")} == plain
    marker = json.loads((zoo[family + "-4bit"] / MARKER_FILE).read_text())
    assert marker["quantization"] == quantized["quantization"]
    sizes = [(zoo[n] / "model.safetensors").stat().st_size for n in (family, family + "-4bit")]
    assert sizes[1] < sizes[0] / 3


def test_the_tokenizer_is_demo_tiny_s(zoo: dict[str, Path], demo_tiny: Path) -> None:
    # every architecture's model (the tool-call formats' models add their family's markers and template)
    for path in (zoo[name] for name in ARCH_MODELS):
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
            assert (path / f).read_bytes() == (demo_tiny / f).read_bytes(), (path.name, f)


def test_model_names_resolve_to_the_generated_folders(zoo: dict[str, Path]) -> None:
    from config import load_settings
    from engine.model import ModelError, resolve

    def settings(model: str):
        return load_settings({"MODEL": model, "MODEL_CACHE_DIR": str(MODEL_CACHE)}, Path("/nonexistent/.env"))

    assert resolve(settings("zoo-qwen3.5-4bit")) == zoo["qwen3.5-4bit"]
    with pytest.raises(ModelError, match="is not a zoo model: use one of zoo-llama, .*zoo-ministral3-4bit"):
        resolve(settings("zoo-qwen3_5"))
