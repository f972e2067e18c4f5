"""Zoo models on disk: generated into the demo models' cache folder once, found there afterwards."""

from __future__ import annotations

import importlib
import time
from pathlib import Path

from engine.modelgen.store import ensure, write_json
from engine.modelgen.tokenizer import ENDOFTEXT, IM_END, quiet_ids, write_tokenizer
from engine.zoo.configs import CONTEXT_LENGTH, HIDDEN, SHAPES, config
from engine.zoo.names import (FORMAT_MODELS, MTP_MODELS, QUANTIZED_SUFFIX, SERVED_MODELS, SHAPE_MODELS,
                              TOOLS_PREFIX, VISION_MODELS, WIDE_MODELS)

# Part of the directory name: bump it whenever anything in this package or engine/modelgen changes
# the generated files, so an old cached copy is never mistaken for the current one.
VERSION = 2
MARKER_FILE = "zoo-model.json"
PREFIX = "zoo-"
# demo-tiny's tokenizer exactly, so token ids compare between the demo model and every zoo model.
VOCAB, FILLER_WORDS = 1024, 0
# Helper models (embeddings, rerank: engine/helpers): each module generates its own (MODELS, generate); one line each.
HELPER_MODULES = (
    "engine.zoo.helpers_decoder",
    "engine.zoo.helpers_encoder",
)
# helper name (without "zoo-") -> its module
HELPER_MODELS = {name: module for module in HELPER_MODULES for name in importlib.import_module(module).MODELS}


def _generate(name: str, out: Path) -> dict:
    """Write every file of zoo model `name` into the existing directory `out`; return the marker."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_map_with_path
    from mlx_lm.utils import get_total_parameters, save_config

    from engine.zoo.weights import build

    started = time.perf_counter()
    if name in VISION_MODELS:  # mlx-vlm's classes, tower and projector included
        from engine.zoo import vision

        marker = {"name": name, "version": VERSION} | vision.generate(name, out)
        write_json(out / MARKER_FILE, marker)
        return marker | {"seconds": time.perf_counter() - started}
    if name in FORMAT_MODELS:  # a family's own chat format: its architecture, its template and tokens
        model, cfg = _format_model(name, FORMAT_MODELS[name], out)
        size, eos_id = cfg["vocab_size"], cfg["eos_token_id"][0]
    else:
        family = (SHAPE_MODELS.get(name) or WIDE_MODELS.get(name) or MTP_MODELS.get(name)
                  or name.removesuffix(QUANTIZED_SUFFIX))
        extra, tokenizer_options = (), {}
        if name.startswith(TOOLS_PREFIX):  # a tool-call format's model: the small Qwen3, the family's tokenizer
            from engine.zoo import tool_families

            fmt = name.removeprefix(TOOLS_PREFIX)
            family, extra = "qwen3", tool_families.MARKERS[fmt]
            tokenizer_options = {"extra": extra, "template": tool_families.template(fmt), "tool_parser": None}
        vocab = write_tokenizer(out, VOCAB, FILLER_WORDS, CONTEXT_LENGTH, **tokenizer_options)
        eos_id = vocab[IM_END]
        size = VOCAB + len(extra)
        cfg = config(family, size, eos_id, vocab[ENDOFTEXT]) | SHAPES.get(name, {})
        if name in WIDE_MODELS:
            from engine.zoo.wide import widened

            cfg = widened(cfg)
        if name in MTP_MODELS:
            from engine.zoo import mtp

            cfg = mtp.mtp_config(cfg)
        hidden = SHAPES.get(name, {}).get("hidden_size", HIDDEN)
        quiet = quiet_ids(vocab, tuple(text for text, _ in extra))
        model, cfg = build(cfg, hidden, quiet, quantized=name.endswith(QUANTIZED_SUFFIX))
        if name in SHAPES:  # the checkpoint's dtypes: float16 weights around float32 norms
            model.update(tree_map_with_path(lambda path, v: v if "norm" in path else v.astype(mx.float16),
                                            model.parameters()))
    if name in MTP_MODELS:
        model = mtp.main_model(name, model)
    tensors = dict(sorted(tree_flatten(model.parameters())))
    if name in MTP_MODELS:  # the heads, in the file mlx-lm reads for the family where it drops them
        tensors = mtp.main_tensors(cfg, tensors)
        heads, trained = mtp.heads(name, model, cfg, hidden, quiet)
        file = mtp.HEADS_FILE.get(cfg["model_type"], "model.safetensors")
        if file == "model.safetensors":
            tensors = dict(sorted((tensors | heads).items()))
        else:
            mx.save_safetensors(str(out / file), heads, metadata={"format": "mlx"})
    mx.save_safetensors(str(out / "model.safetensors"), tensors, metadata={"format": "mlx"})
    save_config(cfg, out / "config.json")  # mlx-lm's own writer: sorted keys, its quantization entries
    marker = {
        "name": name,
        "version": VERSION,
        "model_type": cfg["model_type"],
        "parameters": get_total_parameters(model),
        "vocab_size": size,
        "eos_token_id": eos_id,
        "dtype": cfg.get("torch_dtype", "float32"),
        "quantization": cfg.get("quantization"),
    }
    if name in MTP_MODELS and trained:
        marker["mtp"] = trained
    # Written last: a directory without it is unfinished and never used.
    write_json(out / MARKER_FILE, marker)
    marker["seconds"] = time.perf_counter() - started  # returned, not written: files stay reproducible
    return marker


def _format_model(name: str, family: str, out: Path):
    """A model of `family` with the tokenizer and template of its own chat format (engine/zoo/formats.py)."""
    from engine.zoo import formats
    from engine.zoo.weights import build

    vocab, tokens = formats.write_tokenizer(out, name, VOCAB, CONTEXT_LENGTH)
    cfg = config(family, len(vocab), vocab[formats.SPEECH[name].eos[0]], vocab[ENDOFTEXT])
    cfg["eos_token_id"] = [vocab[t] for t in formats.SPEECH[name].eos]
    # The format's own tokens are as rare as the demo's special ones until a grammar asks for them.
    quiet = sorted(set(quiet_ids({t: i for t, i in vocab.items() if t not in tokens})) | {vocab[t] for t in tokens})
    return build(cfg, HIDDEN, quiet, quantized=False)


def zoo_model_path(name: str, cache_dir: Path) -> Path:
    """Where zoo model `name` (without "zoo-") lives, or will live, under `cache_dir`."""
    if name not in SERVED_MODELS:
        raise ValueError(f"unknown zoo model {name!r}; accepted: {', '.join(SERVED_MODELS)}")
    return Path(cache_dir) / f"{PREFIX}{name}-v{VERSION}"


def ensure_zoo_model(name: str, cache_dir: Path) -> Path:
    """Return the path of zoo model `name`, generating it first if `cache_dir` lacks it (safe when
    several local ranks call it at once: see engine.modelgen.store.ensure)."""
    return ensure(zoo_model_path(name, cache_dir), lambda out: _generate(name, out), MARKER_FILE, VERSION)


def ensure_helper_model(name: str, cache_dir: Path) -> Path:
    """The path of zoo helper model `name` (without "zoo-"), generated first where `cache_dir` lacks it."""
    module = importlib.import_module(HELPER_MODELS[name])

    def generate(out: Path) -> dict:
        marker = module.generate(name, out) | {"version": VERSION}
        write_json(out / MARKER_FILE, marker)  # last: a directory without it is unfinished
        return marker

    return ensure(Path(cache_dir) / f"{PREFIX}{name}-v{VERSION}", generate, MARKER_FILE, VERSION)
