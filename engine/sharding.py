"""Load a model over several ranks: tensor-parallel slices (mlx-lm's shard()) or pipeline stages (its pipeline();
engine/pipeline_llama.py's for llama), as engine/parallel.py decides from what the model can do on these ranks.

    python -m engine.sharding [--ranks N]   # launch.sh start/check: the mode MODEL would run in, or why not
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import socket
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx

from config import Settings
from engine.model import remote_code
from engine.parallel import (PIPELINE, TENSOR, Abilities, ParallelRefused, checked_split, choose, memory_weights,
                             split_layers)
from engine.vision.shard import delegate_shard

log = logging.getLogger(__name__)

# `python -m engine.sharding`: the model runs as configured / it cannot (the sentence on stdout) / no verdict here
VERDICT_OK, VERDICT_REFUSED, VERDICT_UNKNOWN = 0, 3, 4
_MIB = 2**20


@dataclass
class Layout:
    """How the ranks hold the model: the mode, and in pipeline mode the layers of each rank (rank 0 first)."""

    mode: str
    split: list[int] = field(default_factory=list)
    note: str = ""  # why the mode is not the one PARALLEL asked for (the log line; status shows it too)


def abilities(model: Any, config: dict, ranks: int) -> Abilities:
    """What mlx-lm can do with this (lazily built, disposable: it may be sharded here) model on `ranks` ranks,
    asked as sharded_load asks it, and whether shard() divides it evenly over them."""
    from engine.split_probe import unsplit

    delegate_shard()  # the shard()s the engine gives (vision wrappers, Gemma 3): before shard() is asked for
    inner = getattr(model, "model", None)
    pipeline = getattr(inner, "pipeline", None)
    uneven = pipeline is not None and "split" in inspect.signature(pipeline).parameters
    tensor = hasattr(model, "shard")
    return Abilities(model_type=str(config.get("model_type", "?")), tensor=tensor, pipeline=pipeline is not None,
                     uneven=uneven, unsplit=unsplit(model, ranks) if tensor and ranks > 1 else "")


def load_parallel(settings: Settings, target: str, group: mx.distributed.Group) -> tuple[Any, Any, dict, Layout]:
    """(model, tokenizer, config, layout) of this rank; raises ParallelRefused, OSError or ValueError."""
    from mlx_lm.utils import sharded_load

    from engine.mlx_compat import local_model_path
    from engine.pipeline_llama import load_model

    path = local_model_path(target)
    delegate_shard()  # before sharded_load builds the model: a vision-language wrapper shards its text model
    # the classes only: no weight is read
    probe, config = load_model(path, lazy=True, strict=False, **remote_code(settings))
    layers = len(probe.model.layers) if hasattr(getattr(probe, "model", None), "pipeline") else 0
    can = abilities(probe, config, group.size())
    del probe
    mode, note = choose(settings.PARALLEL, group.size(), can)
    if note:
        log.info("%s", note)
    if mode == TENSOR:
        # sharded_load's tokenizer runs the folder's code unless told otherwise
        model, tokenizer, config = sharded_load(target, tensor_group=group, return_config=True,
                                                tokenizer_config=remote_code(settings), **remote_code(settings))
        return model, tokenizer, config, Layout(TENSOR, note=note)
    split = _split(settings, layers, can, group)
    return (*_pipeline_load(settings, path, group, split), Layout(PIPELINE, split, note))


def _split(settings: Settings, layers: int, can: Abilities, group: mx.distributed.Group) -> list[int]:
    """Layers per rank: PIPELINE_LAYERS, else in proportion to each host's memory (every rank computes the same)."""
    ranks = group.size()
    if settings.pipeline_layers:
        split = checked_split(settings.pipeline_layers, layers, ranks)
    else:
        memory, hosts = _gather_memory(group)
        split = split_layers(layers, memory_weights(memory, hosts))
    even = split_layers(layers, [1.0] * ranks)
    if split != even and not can.uneven:
        if settings.pipeline_layers:
            raise ParallelRefused(f"PIPELINE_LAYERS={settings.PIPELINE_LAYERS} cannot be applied: mlx-lm's "
                                  f"{can.model_type} splits its layers evenly only; leave PIPELINE_LAYERS empty")
        log.info("pipeline: mlx-lm's %s splits its layers evenly only; the hosts' memory would give %s", can.model_type,
                 split)
        split = even
    log.info("pipeline parallel: %d layers over %d ranks, %s (rank 0 runs the last layers)", layers, ranks,
             ", ".join(f"rank {r}: {n}" for r, n in enumerate(split)))
    return split


def _gather_memory(group: mx.distributed.Group) -> tuple[list[int], list[str]]:
    """Every rank's memory for the model (MiB) and a token for its host, in rank order."""
    from engine.ranks import model_memory

    mine = model_memory()
    host = zlib.crc32(socket.gethostname().encode()) & 0x7FFFFFFF
    rows = mx.distributed.all_gather(mx.array([[int(mine) // _MIB, host]], dtype=mx.int32), group=group,
                                     stream=mx.cpu)
    values = rows.tolist()
    return [m for m, _ in values], [str(h) for _, h in values]


def _pipeline_load(settings: Settings, path: Path, group: mx.distributed.Group,
                   split: list[int]) -> tuple[Any, Any, dict]:
    """sharded_load(pipeline_group=...) with the split given: mlx-lm's loader splits evenly only."""
    from mlx_lm.utils import load_tokenizer

    from engine.pipeline_llama import load_model

    model, config = load_model(path, lazy=True, **remote_code(settings))
    tokenizer = load_tokenizer(path, remote_code(settings), eos_token_ids=config.get("eos_token_id", None))
    if split == split_layers(len(model.model.layers), [1.0] * group.size()):
        model.model.pipeline(group)  # mlx-lm's own split, for the models whose pipeline() takes no split
    else:
        model.model.pipeline(group, split=split)
    mx.eval(model.parameters())
    # every rank has its layers before any serves (as sharded_load does)
    mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group, stream=mx.cpu))
    return model, tokenizer, config


def verdict(settings: Settings, ranks: int) -> tuple[int, str]:
    """(VERDICT_*, sentence) for MODEL on `ranks` ranks, from mlx-lm's class for it; no weights are read."""
    from engine.mlx_compat import local_model_path
    from engine.model import ModelError, resolve
    from engine.pipeline_llama import load_model

    try:
        path = local_model_path(str(resolve(settings)), download=False)
        model, config = load_model(path, lazy=True, strict=False, **remote_code(settings))
    except (ModelError, OSError, ValueError, KeyError) as exc:
        return VERDICT_UNKNOWN, f"the parallel mode of MODEL={settings.MODEL} cannot be told here: {exc}"
    try:
        mode, note = choose(settings.PARALLEL, ranks, abilities(model, config, ranks))
    except ParallelRefused as exc:
        return VERDICT_REFUSED, str(exc)
    return VERDICT_OK, note or mode


def main() -> int:
    from config import ConfigError, load_settings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=0, help="ranks of the engine (default: one per HOSTS entry)")
    args = parser.parse_args()
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(json.dumps({"verdict": VERDICT_UNKNOWN, "text": str(exc)}))
        return VERDICT_UNKNOWN
    code, text = verdict(settings, args.ranks or settings.ranks)
    print(json.dumps({"verdict": code, "text": text}))
    return code


if __name__ == "__main__":
    sys.exit(main())
