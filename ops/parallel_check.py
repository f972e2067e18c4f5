"""Can the ranks run MODEL at all? Asked before `launch.sh start` starts them and in `launch.sh check`.

A model mlx-lm can neither shard nor pipeline (or pipeline asked of one it only shards) would
otherwise end a rank at load, with the reason only in engine.log. The answer comes from
`python -m engine.sharding` in a child process (ops never imports MLX): the same decision the
engine applies when it loads.
"""

from __future__ import annotations

from config import Settings
from ops.verdict import child_refusal

VERDICT_TIMEOUT = 120  # seconds: importing mlx-lm and building the model's class without weights


def parallel_refusal(settings: Settings, ranks: int) -> str | None:
    """The sentence saying why MODEL cannot run on `ranks` ranks as configured; None when it can, or when
    this host cannot tell (the model is not here: `check` reports that per host, the engine at load)."""
    if ranks <= 1:
        return None
    args = ["-m", "engine.sharding", "--ranks", str(ranks)]
    return child_refusal(args, VERDICT_TIMEOUT)

