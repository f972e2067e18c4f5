"""Resolve MODEL to a folder and load it: whole on one rank; on several, tensor slices or pipeline stages."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx

from config import Settings
from engine.facts import model_facts
from engine.mlx_compat import hf_tokenizer
from ipc.messages import ModelFacts

log = logging.getLogger(__name__)

DEMO_PREFIX = "demo-"
ZOO_PREFIX = "zoo-"
NO_TOKENIZER_LIMIT = int(1e30)  # what Hugging Face tokenizers use for "no maximum length"


class ModelError(Exception):
    """MODEL cannot be resolved or loaded; the message says how to fix it."""


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    path: str
    context_length: int
    # rows of the model's output (logits); may exceed the tokenizer's ids (padded vocabularies)
    vocab_size: int = 0
    facts: ModelFacts = ModelFacts()
    parallel: str = "single"  # engine.parallel: single, tensor or pipeline
    # pipeline: the layers each rank holds, rank 0 first (empty: every rank holds every layer)
    pipeline_split: tuple[int, ...] = ()


def resolve(settings: Settings) -> str | Path:
    """A demo or zoo name becomes its generated folder; a local path must exist; anything else is a repo id."""
    name = settings.MODEL
    if name.startswith(ZOO_PREFIX):
        from engine.zoo import ZOO_MODELS, ensure_zoo_model

        zoo = name[len(ZOO_PREFIX):]
        if zoo not in ZOO_MODELS:
            raise ModelError(f"MODEL={name!r} is not a zoo model: use one of "
                             + ", ".join(ZOO_PREFIX + n for n in ZOO_MODELS))
        return ensure_zoo_model(zoo, settings.model_cache_dir)
    if name.startswith(DEMO_PREFIX):
        from engine.demo import DEMO_MODELS, ensure_demo_model

        size = name[len(DEMO_PREFIX):]
        if size not in DEMO_MODELS:
            raise ModelError(f"MODEL={name!r} is not a demo model: use one of "
                             + ", ".join(DEMO_PREFIX + n for n in DEMO_MODELS))
        return ensure_demo_model(size, settings.model_cache_dir)
    if name.startswith(("/", ".", "~")):
        path = Path(name).expanduser()
        if not (path / "config.json").is_file():
            raise ModelError(f"MODEL={name!r}: no config.json in {path}; give an MLX model folder "
                             "(as written by mlx_lm.convert) or a Hugging Face repo id")
        return path
    return name


def context_length(config: dict) -> int:
    for key in ("max_position_embeddings", "max_seq_len", "seq_length", "n_positions"):
        if isinstance(config.get(key), int):
            return config[key]
    text = config.get("text_config") or {}
    return context_length(text) if text else 4096


def vocab_size(config: dict) -> int:
    if isinstance(config.get("vocab_size"), int):
        return config["vocab_size"]
    text = config.get("text_config") or {}
    return vocab_size(text) if text else 0


def load(settings: Settings, group: mx.distributed.Group | None) -> LoadedModel:
    """Load on every rank: whole on one, in the parallel mode engine.parallel chooses on several."""
    from mlx_lm import load as mlx_load

    from engine.parallel import SINGLE, ParallelRefused
    from engine.sharding import Layout, load_parallel

    target = resolve(settings)
    try:
        if group is not None and group.size() > 1:
            model, tokenizer, config, layout = load_parallel(settings, str(target), group)
        else:
            model, tokenizer, config = mlx_load(str(target), return_config=True)
            layout = Layout(SINGLE)
    except ParallelRefused as exc:
        raise ModelError(str(exc)) from exc
    except (OSError, ValueError) as exc:
        raise ModelError(f"MODEL={settings.MODEL!r} could not be loaded: {exc}") from exc
    # Rank 0 refuses a prompt longer than the context itself, with a 400 that says so. The tokenizer's own
    # check would log that running such a prompt "will result in indexing errors" when it never runs.
    hf_tokenizer(tokenizer).model_max_length = NO_TOKENIZER_LIMIT
    return LoadedModel(model=model, tokenizer=tokenizer, path=str(target), context_length=context_length(config),
                       vocab_size=vocab_size(config) or len(tokenizer),
                       facts=model_facts(_folder(target), config, tokenizer), parallel=layout.mode,
                       pipeline_split=tuple(layout.split))


def _folder(target: str | Path) -> Path | None:
    """The local folder of a loaded model: target itself, or a repo id's snapshot in the Hugging Face cache."""
    if isinstance(target, Path):
        return target
    from mlx_lm.utils import hf_repo_to_path

    try:
        return hf_repo_to_path(target)
    except (OSError, ValueError) as exc:
        log.warning("the files of %s are not at hand (%s): its size and parameter count stay unknown", target, exc)
        return None
