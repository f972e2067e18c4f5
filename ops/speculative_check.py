"""Can SPECULATIVE run with MODEL (and DRAFT_MODEL)? Asked before `launch.sh start` and in `launch.sh check`.

A draft model of another tokenizer, or MTP asked of a model without the heads, would otherwise end rank 0 at
load, with the reason only in engine.log. The answer comes from `python -m engine.speculative.preflight` in a
child process (ops never imports MLX), with the engine's own sentences.
"""

from __future__ import annotations

from config import Settings
from ops.verdict import child_refusal

VERDICT_TIMEOUT = 120  # seconds: importing mlx-lm and reading two tokenizers


def speculative_refusal(settings: Settings) -> str | None:
    """The sentence saying why SPECULATIVE cannot run as configured; None when it can, or when this host cannot
    tell (the model is not here: `check` reports that per host, the engine at load)."""
    if settings.SPECULATIVE in ("off", "ngram"):
        return None  # nothing of the model is needed: no child process
    args = ["-m", "engine.speculative.preflight"]
    return child_refusal(args, VERDICT_TIMEOUT)
