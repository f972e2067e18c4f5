"""mlx-lm's load errors as one sentence naming the file and what to do; no MLX here, so it is unit-tested.

What the files alone show is config.model_folder's (checked before loading); this is what only building
the model tells: weights whose names or shapes do not fit the model config.json describes, settings
config.json lacks, a tokenizer that transformers cannot build.
"""

from __future__ import annotations

import json
import re
from pathlib import Path



class ModelError(Exception):
    """MODEL cannot be resolved or loaded; the message says how to fix it (engine.model re-exports it)."""


_SHAPE = re.compile(r"Expected shape (\(.*?\)) but received shape (\(.*?\)) for parameter (\S+)")
_MISSING = re.compile(r"Missing (\d+) parameters?:\s*(\S+?),?\s*(?:$|\n)")
_EXTRA = re.compile(r"Received (\d+) parameters? not in model:\s*(\S+?)[,.]?\s*(?:$|\n)")
_ARGUMENT = re.compile(r"missing \d+ required (?:positional |keyword-only )?arguments?: '(\w+)'")
_UNSUPPORTED = re.compile(r"Model type (\S+) not supported")
FIX_CONFIG = "restore the config.json that came with the weights, or convert the model again (mlx_lm.convert)"


def explain(folder: Path, exc: BaseException) -> str:
    """The sentence for an exception mlx-lm raised while loading the model in folder."""
    text = str(exc)
    config = folder / "config.json"
    model_type = _model_type(config)
    if m := _SHAPE.search(text):
        expected, got, name = m.groups()
        return (f"{_weights_file(folder, name)} does not fit {config}: {name} has shape {got} where the "
                f"{model_type} model that config.json describes expects {expected}; the config was changed after "
                f"the weights were made, or they belong to another model: {FIX_CONFIG}")
    if m := _MISSING.search(text):
        count, name = m.groups()
        return (f"the weights in {folder} lack {count} parameter(s) that the {model_type} model of {config} needs "
                f"(the first: {name}): a weights file is missing or the config was changed; {FIX_CONFIG}")
    if m := _EXTRA.search(text):
        count, name = m.groups()
        return (f"{_weights_file(folder, name)} holds {count} parameter(s) that the {model_type} model of {config} "
                f"does not have (the first: {name}); the config was changed after the weights were made, or they "
                f"belong to another model: {FIX_CONFIG}")
    if m := _ARGUMENT.search(text):
        return f"{config} lacks {m.group(1)}, which the {model_type} model needs: {FIX_CONFIG}"
    if m := _UNSUPPORTED.search(text):
        return (f"{config} names model_type {model_type!r}, which this mlx-lm cannot build ({m.group(1)} is not in "
                "mlx_lm.models): serve a model of an architecture mlx-lm supports")
    first = text.strip().splitlines()[0].rstrip(" :") if text.strip() else ""
    if not (isinstance(exc, (ValueError, OSError)) and first):  # the message alone does not say what failed
        first = f"{type(exc).__name__}: {first}".rstrip(": ")
    if _raised_by_tokenizer(exc) or "tokenizer" in text.lower():
        return (f"the tokenizer in {folder} does not load ({first}): copy tokenizer.json and tokenizer_config.json "
                "again from the original model")
    return f"the model in {folder} does not load ({first})"


def _raised_by_tokenizer(exc: BaseException) -> bool:
    """mlx-lm loads the weights, then the tokenizer: where the exception was raised tells which failed."""
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name.endswith("tokenizer_utils.py") or "/transformers/" in name or "/tokenizers/" in name:
            return True
        tb = tb.tb_next
    return False


def _model_type(config: Path) -> str:
    try:
        doc = json.loads(config.read_text())
        return str(doc["model_type"]) if isinstance(doc, dict) else "?"
    except (OSError, ValueError, KeyError):
        return "?"


def _weights_file(folder: Path, name: str) -> str:
    """The file that holds parameter name: the index says which shard; one file is the only one."""
    try:
        shard = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"][name]
        return str(folder / shard)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    files = sorted(folder.glob("model*.safetensors"))
    return str(files[0]) if len(files) == 1 else f"the weights in {folder}"
