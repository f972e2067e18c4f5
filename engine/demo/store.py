"""Demo models on disk: generated into a cache folder once, found there afterwards."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from engine.demo.specs import DEMO_MODELS, SPECS, Spec
from engine.demo.tokenizer import ENDOFTEXT, IM_END, chat_template, quiet_ids, train_tokenizer
from engine.demo.weights import weights

# Part of the directory name: bump it whenever anything in this package changes the generated
# files, so an old cached copy is never mistaken for the current one.
VERSION = 2
MARKER_FILE = "demo-model.json"
DEFAULT_CACHE_DIR = Path("~/.cache/mlx-cluster-serve").expanduser()

# Tokens of context: agents send prompts of 10k-100k tokens (a coding agent's first request alone
# is ~40k of the demo tokenizer's tokens). Random RoPE weights need no training for long positions.
CONTEXT_LENGTH = 131072


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


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


def _tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": CONTEXT_LENGTH,
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "tool_parser_type": "json_tools",
        "chat_template": chat_template(),
    }


def _generate(name: str, out: Path) -> dict:
    """Write every file of demo model `name` into the existing directory `out`; return the marker."""
    import mlx.core as mx

    spec = SPECS[name]
    started = time.perf_counter()
    tok = train_tokenizer(spec.vocab, spec.filler_words)
    tok.save(str(out / "tokenizer.json"), pretty=False)
    vocab = tok.get_vocab()
    eos_id, pad_id = vocab[IM_END], vocab[ENDOFTEXT]
    config = _config(spec, eos_id, pad_id)
    tensors = weights(spec, config, quiet_ids(vocab))
    params = sum(int(w.size) for w in tensors.values())
    mx.save_safetensors(str(out / "model.safetensors"), tensors, metadata={"format": "mlx"})
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", {"bos_token_id": None, "eos_token_id": [eos_id, pad_id],
                                                 "pad_token_id": pad_id})
    _write_json(out / "tokenizer_config.json", _tokenizer_config())
    _write_json(out / "special_tokens_map.json", {"eos_token": IM_END, "pad_token": ENDOFTEXT})
    marker = {
        "name": name,
        "version": VERSION,
        "parameters": params,
        "vocab_size": spec.vocab,
        "eos_token_id": eos_id,
        "dtype": "float32",
    }
    # Written last: a directory without it is unfinished and never used.
    _write_json(out / MARKER_FILE, marker)
    marker["seconds"] = time.perf_counter() - started  # returned, not written: files stay reproducible
    return marker


def _check_name(name: str) -> None:
    if name not in SPECS:
        raise ValueError(f"unknown demo model {name!r}; accepted: {', '.join(DEMO_MODELS)}")


def demo_model_path(name: str, cache_dir: Path) -> Path:
    """Where demo model `name` lives (or will live) under `cache_dir`."""
    _check_name(name)
    return Path(cache_dir) / f"demo-{name}-v{VERSION}"


def _is_complete(path: Path) -> bool:
    try:
        marker = json.loads((path / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return marker.get("version") == VERSION


def ensure_demo_model(name: str, cache_dir: Path) -> Path:
    """Return the path of demo model `name`, generating it first if `cache_dir` lacks it.

    Safe when several processes (the local ranks of one host) call it at once: each generates
    into its own temporary directory and renames it into place; the losers, finding the target
    there, throw their copy away. Every copy is identical, so it does not matter who wins.
    """
    target = demo_model_path(name, cache_dir)
    if _is_complete(target):
        return target
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=cache_dir))
    try:
        _generate(name, tmp)
        # Generation runs unlocked (a second of duplicated work at worst); the lock only makes
        # "check, clear a leftover, rename" one step, so no process removes a finished model.
        with open(cache_dir / f".{target.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not _is_complete(target):
                if target.exists():  # no marker: unfinished, or written by hand
                    shutil.rmtree(target)
                os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
