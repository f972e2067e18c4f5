"""Can SPECULATIVE run with MODEL (and DRAFT_MODEL)? Asked before `launch.sh start` and in `launch.sh check`.

A draft model of another tokenizer, or MTP asked of a model without the heads, would otherwise end rank 0 at
load, with the reason only in engine.log. The answer comes from `python -m engine.speculative.preflight` in a
child process (ops never imports MLX), with the engine's own sentences.
"""

from __future__ import annotations

import json
import subprocess
import sys

from config import REPO_ROOT, Settings

VERDICT_TIMEOUT = 120  # seconds: importing mlx-lm and reading two tokenizers
REFUSED = 3  # engine.speculative.preflight.VERDICT_REFUSED


def speculative_refusal(settings: Settings) -> str | None:
    """The sentence saying why SPECULATIVE cannot run as configured; None when it can, or when this host cannot
    tell (the model is not here: `check` reports that per host, the engine at load)."""
    if settings.SPECULATIVE in ("off", "ngram"):
        return None  # nothing of the model is needed: no child process
    cmd = [sys.executable, "-m", "engine.speculative.preflight"]
    try:
        r = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=VERDICT_TIMEOUT,
                           stdin=subprocess.DEVNULL)
        answer = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    return answer.get("text") if r.returncode == REFUSED and answer.get("verdict") == REFUSED else None
