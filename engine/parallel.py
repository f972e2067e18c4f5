"""Which parallel mode several ranks run a model in, and how pipeline ranks split its layers.

No MLX here: what a model can do arrives as `Abilities` (engine/sharding.py reads them from
mlx-lm's model class), so `launch.sh start` and `check` refuse a model the engine could not run
with the same sentence the engine would log, and unit tests drive every case.

tensor: mlx-lm's `Model.shard()` gives every rank a slice of every layer. pipeline: mlx-lm's
`model.model.pipeline()` gives every rank whole layers (rank 0 the last ones).
"""

from __future__ import annotations

from dataclasses import dataclass

AUTO = "auto"  # tensor where mlx-lm's shard() can split the model over the ranks, else pipeline
TENSOR = "tensor"
PIPELINE = "pipeline"
SINGLE = "single"  # one rank holds the whole model


class ParallelRefused(Exception):
    """The model cannot run as configured on these ranks; the message says why and what to do."""


@dataclass(frozen=True)
class Abilities:
    """What mlx-lm can do with a model_type: shard it, pipeline it, and give pipeline ranks unequal shares.

    unsplit: why shard() cannot split this model over the ranks at hand, as a clause (a head count they do not
    divide); empty when it can. shard() itself divides counts with // and would fail every request instead."""

    model_type: str
    tensor: bool
    pipeline: bool
    uneven: bool = False
    unsplit: str = ""


def choose(requested: str, ranks: int, can: Abilities) -> tuple[str, str]:
    """(mode, note): the mode the ranks run, and a line to log and show in status when it is not tensor as
    PARALLEL=auto would have it.

    PARALLEL=auto (the default) runs tensor where it can and pipeline otherwise; PARALLEL=tensor and
    PARALLEL=pipeline are deliberate choices (decode speed; capacity, unequal Macs), so a model that cannot
    run that way is refused in one sentence, not switched."""
    if ranks <= 1:
        return SINGLE, ""
    arch = can.model_type
    if requested == PIPELINE:
        if can.pipeline:
            return PIPELINE, ""
        if can.tensor and not can.unsplit:
            raise ParallelRefused(
                f"MODEL's architecture {arch} cannot run in pipeline parallel on {ranks} ranks: mlx-lm's {arch} "
                "model has no pipeline(); set PARALLEL=tensor (it supports tensor parallelism), or serve it on one "
                "host (HOSTS with a single entry)")
        raise _neither(can, ranks)
    if can.tensor and not can.unsplit:
        return TENSOR, ""
    why = _no_tensor(can, ranks)
    if requested == TENSOR:
        if not can.pipeline:
            raise _neither(can, ranks)
        raise ParallelRefused(f"PARALLEL=tensor cannot run MODEL on {ranks} ranks: {why}; set PARALLEL=pipeline "
                              "(or auto) to split its layers instead")
    if can.pipeline:
        return PIPELINE, f"{why}: running it in pipeline parallel, each of the {ranks} ranks holding whole layers"
    raise _neither(can, ranks)


def _no_tensor(can: Abilities, ranks: int) -> str:
    """Why the ranks cannot hold slices of every layer, as a clause."""
    if not can.tensor:
        return f"{can.model_type} has no tensor parallelism in mlx-lm (no shard())"
    return can.unsplit


def _neither(can: Abilities, ranks: int) -> ParallelRefused:
    arch = can.model_type
    if can.tensor:  # shard() exists but cannot split this model over these ranks
        return ParallelRefused(
            f"MODEL's architecture {arch} cannot run on {ranks} ranks: {_no_tensor(can, ranks)}, and mlx-lm's "
            f"{arch} model has no pipeline() to split its layers instead; serve it on a number of hosts that "
            "divides them, or on one host (HOSTS with a single entry)")
    return ParallelRefused(
        f"MODEL's architecture {arch} cannot run on {ranks} ranks: mlx-lm can neither shard it (no shard(), for "
        "tensor parallelism) nor split its layers (no pipeline(), for pipeline parallelism); serve it on one host "
        "(HOSTS with a single entry)")


def split_layers(layers: int, weights: list[float]) -> list[int]:
    """Layers per rank in proportion to weights (at least one each), rounded by largest remainder so equal
    weights give mlx-lm's own even split (the extra layers to the low ranks)."""
    ranks = len(weights)
    if layers < ranks:
        raise ParallelRefused(f"the model has {layers} layers, fewer than the {ranks} ranks of the pipeline: "
                              "serve it on fewer hosts")
    total = sum(weights)
    if total <= 0 or any(w <= 0 for w in weights):
        weights, total = [1.0] * ranks, float(ranks)
    # one layer each first, then the rest by share
    spare = layers - ranks
    exact = [spare * w / total for w in weights]
    counts = [int(x) for x in exact]
    order = sorted(range(ranks), key=lambda r: (-(exact[r] - counts[r]), r))
    for r in order[:spare - sum(counts)]:
        counts[r] += 1
    return [c + 1 for c in counts]


def checked_split(counts: list[int], layers: int, ranks: int) -> list[int]:
    """PIPELINE_LAYERS as given, when it fits the model and the ranks."""
    if len(counts) != ranks or sum(counts) != layers:
        raise ParallelRefused(
            f"PIPELINE_LAYERS={','.join(map(str, counts))} does not fit: the model has {layers} layers on {ranks} "
            f"ranks, so give {ranks} positive counts summing to {layers} (rank 0 first), or leave it empty to "
            "split by memory")
    return counts


def memory_weights(memory: list[int], hosts: list[str]) -> list[float]:
    """Each rank's share of its host's memory: ranks on one host divide it."""
    per_host = {h: hosts.count(h) for h in hosts}
    return [m / per_host[h] for m, h in zip(memory, hosts)]


def stage_layers(split: list[int], rank: int) -> range:
    """The layers pipeline rank `rank` holds, as mlx-lm's pipeline() assigns them from each rank's count (rank 0
    first): rank r runs the layers after those of ranks r+1 .. size-1, so rank 0 holds the last ones."""
    first = sum(split[rank + 1:])
    return range(first, first + split[rank])


def last_stage(split: list[int]) -> int:
    """The pipeline rank holding the model's last layer: the one whose output is the final hidden state."""
    return next(r for r in range(len(split)) if stage_layers(split, r).stop == sum(split))


def holds_heads(mode: str, rank: int, split: list[int]) -> bool:
    """Whether this rank loads SPECULATIVE=mtp's heads: every rank alone or under tensor parallel (sharded like the
    main layers, their all_sums must meet); under pipeline the last stage alone, which holds the final hidden
    state the heads read and, like every stage, the embedding and lm_head."""
    return mode != PIPELINE or rank == last_stage(split)
