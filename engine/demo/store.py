"""Demo models on disk: generated into a cache folder once, found there afterwards."""

from __future__ import annotations

import time
from pathlib import Path

from engine.demo.specs import DEMO_MODELS, SPECS, Spec
from engine.demo.weights import weights
from engine.modelgen.store import DEFAULT_CACHE_DIR, ensure, write_json
from engine.modelgen.tokenizer import ENDOFTEXT, IM_END, quiet_ids, write_tokenizer

# Part of the directory name: bump it whenever anything in this package or engine/modelgen changes
# the generated files, so an old cached copy is never mistaken for the current one.
VERSION = 2
MARKER_FILE = "demo-model.json"

# Tokens of context: agents send prompts of 10k-100k tokens (a coding agent's first request alone
# is ~40k of the demo tokenizer's tokens). Random RoPE weights need no training for long positions.
CONTEXT_LENGTH = 131072


def _config(spec: Spec, eos_id: int, pad_id: int) -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": spec.hidden,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate,
        "vocab_size": spec.vocab,
        "max_position_embeddings": CONTEXT_LENGTH,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        # Untied: with a tied head, a hidden state dominated by the current token's embedding makes
        # greedy decoding repeat that token forever.
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "attention_bias": False,
        "torch_dtype": "float32",
        "bos_token_id": None,
        "eos_token_id": [eos_id, pad_id],
        "pad_token_id": pad_id,
    }


def _generate(name: str, out: Path) -> dict:
    """Write every file of demo model `name` into the existing directory `out`; return the marker."""
    import mlx.core as mx

    spec = SPECS[name]
    started = time.perf_counter()
    vocab = write_tokenizer(out, spec.vocab, spec.filler_words, CONTEXT_LENGTH)
    eos_id, pad_id = vocab[IM_END], vocab[ENDOFTEXT]
    config = _config(spec, eos_id, pad_id)
    tensors = weights(spec, config, quiet_ids(vocab))
    params = sum(int(w.size) for w in tensors.values())
    mx.save_safetensors(str(out / "model.safetensors"), tensors, metadata={"format": "mlx"})
    write_json(out / "config.json", config)
    marker = {
        "name": name,
        "version": VERSION,
        "parameters": params,
        "vocab_size": spec.vocab,
        "eos_token_id": eos_id,
        "dtype": "float32",
    }
    # Written last: a directory without it is unfinished and never used.
    write_json(out / MARKER_FILE, marker)
    marker["seconds"] = time.perf_counter() - started  # returned, not written: files stay reproducible
    return marker


def _check_name(name: str) -> None:
    if name not in SPECS:
        raise ValueError(f"unknown demo model {name!r}; accepted: {', '.join(DEMO_MODELS)}")


def demo_model_path(name: str, cache_dir: Path) -> Path:
    """Where demo model `name` lives (or will live) under `cache_dir`."""
    _check_name(name)
    return Path(cache_dir) / f"demo-{name}-v{VERSION}"


def ensure_demo_model(name: str, cache_dir: Path) -> Path:
    """Return the path of demo model `name`, generating it first if `cache_dir` lacks it (safe when
    several local ranks call it at once: see engine.modelgen.store.ensure)."""
    return ensure(demo_model_path(name, cache_dir), lambda out: _generate(name, out), MARKER_FILE, VERSION)
