"""Can the ranks run MODEL at all? Asked before `launch.sh start` starts them and in `launch.sh check`.

A model mlx-lm can neither shard nor pipeline (or pipeline asked of one it only shards) would
otherwise end a rank at load, with the reason only in engine.log. The answer comes from
`python -m engine.sharding` in a child process (ops never imports MLX): the same decision the
engine applies when it loads.
"""

from __future__ import annotations

from config import Settings
from ops.verdict import REFUSED, child_verdict

VERDICT_TIMEOUT = 120  # seconds: importing mlx-lm and building the model's class without weights


ACCEPTED = 0  # engine.sharding.VERDICT_OK


def parallel_verdict(settings: Settings, ranks: int) -> tuple[str | None, str]:
    """(refusal, mode): the sentence saying why MODEL cannot run on `ranks` ranks as configured (None when it
    can, or when this host cannot tell: the model is not here, which `check` reports per host, the engine at
    load), and the mode it will run in, with why when PARALLEL=auto did not get tensor ("" when not told)."""
    if ranks <= 1:
        return None, ""
    code, text = child_verdict(["-m", "engine.sharding", "--ranks", str(ranks)], VERDICT_TIMEOUT)
    return (text if code == REFUSED else None), (text if code == ACCEPTED else "")


def parallel_refusal(settings: Settings, ranks: int) -> str | None:
    """parallel_verdict's refusal alone (`launch.sh start`)."""
    return parallel_verdict(settings, ranks)[0]

