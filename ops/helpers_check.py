"""Can the helper models (EMBEDDING_MODEL, RERANK_MODEL) load? Asked before `launch.sh start` and in `launch.sh
check`; the answer comes from `python -m engine.helpers.preflight` in a child process (ops never imports MLX)."""

from __future__ import annotations

from config import Settings
from ops.verdict import child_refusal

VERDICT_TIMEOUT = 120  # seconds: importing mlx-lm, and generating a zoo helper on first use


def helper_refusal(settings: Settings) -> str | None:
    """The sentence saying why a helper setting cannot load; None when it can, when none is set (no child process),
    or when this host cannot tell."""
    if not (settings.EMBEDDING_MODEL.strip() or settings.RERANK_MODEL.strip()):
        return None
    return child_refusal(["-m", "engine.helpers.preflight"], VERDICT_TIMEOUT)
