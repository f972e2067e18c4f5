"""What a model folder's sentence-transformers files say about its embeddings: the pooling (modules.json's
Pooling module and its config.json), whether a Normalize module follows, and the longest input
(sentence_bert_config.json's max_seq_length). No MLX: unit-tested on plain folders.

A folder without modules.json gets what sentence-transformers gives a plain Hugging Face model:
mean pooling, no normalization, the longest input its position table allows.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from engine.load_errors import ModelError

# 1_Pooling/config.json's flags, by the mode each names (sentence_transformers.models.Pooling).
POOLING_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                 "pooling_mode_max_tokens": "max", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
                 "pooling_mode_lasttoken": "lasttoken", "pooling_mode_weightedmean_tokens": "weightedmean"}
POOLING_MODES = ("cls", "mean", "max", "mean_sqrt_len", "lasttoken")
_MODULE = "sentence_transformers.models."
# Modules that leave the transformer's token embeddings as they are.
_PASSIVE = {"Transformer", "Pooling", "Normalize"}


class Embedding(msgspec.Struct, frozen=True):
    """How the folder turns token embeddings into one vector."""

    pooling: str = "mean"
    normalize: bool = False
    max_seq_length: int | None = None


def _json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ModelError(f"{path} is not valid JSON ({exc}); restore the file that came with the model") from exc


def pooling_mode(config: dict, path: Path) -> str:
    """The one mode 1_Pooling/config.json turns on (newer files name it in "pooling_mode")."""
    modes = [mode for flag, mode in POOLING_FLAGS.items() if config.get(flag)]
    if isinstance(config.get("pooling_mode"), str):
        modes = [config["pooling_mode"].removesuffix("_token").removesuffix("_tokens")]
    if len(modes) != 1:
        raise ModelError(f"{path} turns on {len(modes)} pooling modes ({', '.join(modes) or 'none'}); "
                         "embeddings need exactly one: set one of " + ", ".join(POOLING_FLAGS) + " to true")
    if modes[0] not in POOLING_MODES:
        raise ModelError(f"{path} asks for {modes[0]} pooling, which this server lacks (it has "
                         f"{', '.join(POOLING_MODES)}); serve another embedding model")
    return modes[0]


def read_embedding(folder: Path) -> Embedding:
    """The folder's pooling, normalization and max_seq_length as its sentence-transformers files say."""
    modules_path = folder / "modules.json"
    bert_config = folder / "sentence_bert_config.json"
    max_seq = _json(bert_config).get("max_seq_length") if bert_config.exists() else None
    if not modules_path.exists():
        return Embedding(max_seq_length=max_seq)
    pooling, normalize = "mean", False
    for module in _json(modules_path):
        kind = str(module.get("type", "")).removeprefix(_MODULE)
        if kind == "Pooling":
            path = folder / module.get("path", "") / "config.json"
            pooling = pooling_mode(_json(path), path)
        elif kind == "Normalize":
            normalize = True
        elif kind not in _PASSIVE:
            raise ModelError(f"{modules_path} lists a {module.get('type')} module ({module.get('path')}), which this "
                             "server does not run; serve a model whose modules are Transformer, Pooling and Normalize")
    return Embedding(pooling=pooling, normalize=normalize, max_seq_length=max_seq)


def pools_embeddings(folder: Path) -> bool:
    """Whether the folder's modules.json pools token embeddings into one vector (an embedding model's files)."""
    path = folder / "modules.json"
    return path.exists() and any(str(m.get("type", "")).endswith(".Pooling") for m in _json(path))


def max_tokens(config: dict, max_seq_length: int | None, offset: int = 0) -> int:
    """The longest input: max_seq_length where the folder sets one, never past the position table
    (less the positions RoBERTa never uses)."""
    positions = config["max_position_embeddings"] - offset
    return min(max_seq_length, positions) if max_seq_length else positions
