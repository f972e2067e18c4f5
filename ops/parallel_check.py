"""Can the ranks run MODEL at all? Asked before `launch.sh start` starts them and in `launch.sh check`.

A model mlx-lm can neither shard nor pipeline (or pipeline asked of one it only shards) would
otherwise end a rank at load, with the reason only in engine.log. The answer comes from
`python -m engine.sharding` in a child process (ops never imports MLX): the same decision the
engine applies when it loads.
"""

from __future__ import annotations

import json
import subprocess
import sys

from config import REPO_ROOT, Settings

VERDICT_TIMEOUT = 120  # seconds: importing mlx-lm and building the model's class without weights
REFUSED = 3  # engine.sharding.VERDICT_REFUSED


def parallel_refusal(settings: Settings, ranks: int) -> str | None:
    """The sentence saying why MODEL cannot run on `ranks` ranks as configured; None when it can, or when
    this host cannot tell (the model is not here: `check` reports that per host, the engine at load)."""
    if ranks <= 1:
        return None
    cmd = [sys.executable, "-m", "engine.sharding", "--ranks", str(ranks)]
    try:
        r = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=VERDICT_TIMEOUT,
                           stdin=subprocess.DEVNULL)
        answer = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    return answer.get("text") if r.returncode == REFUSED and answer.get("verdict") == REFUSED else None

