"""Can SPECULATIVE run with MODEL (and DRAFT_MODEL)? Asked before `launch.sh start` and in `launch.sh check`.

A draft model of another tokenizer, or MTP asked of a model without the heads, would otherwise end rank 0 at
load, with the reason only in engine.log; a model whose caches cannot roll back a draft decodes plainly, which
`check` warns of. The answer comes from `python -m engine.speculative.preflight` in a child process (ops never
imports MLX), with the engine's own sentences.
"""

from __future__ import annotations

from config import Settings
from ops.verdict import REFUSED, WARNED, child_verdict

VERDICT_TIMEOUT = 120  # seconds: importing mlx-lm and reading two tokenizers


def speculative_verdict(settings: Settings) -> tuple[str | None, str | None]:
    """(refusal, warning): the sentence saying why SPECULATIVE cannot run as configured, and the one saying it runs
    but decodes plainly (the model's caches cannot roll back a draft); None for each that does not apply, or when
    this host cannot tell (the model is not here: `check` reports that per host, the engine at load)."""
    if settings.SPECULATIVE == "off":
        return None, None
    code, text = child_verdict(["-m", "engine.speculative.preflight"], VERDICT_TIMEOUT)
    return (text if code == REFUSED else None), (text if code == WARNED else None)


def speculative_refusal(settings: Settings) -> str | None:
    """speculative_verdict's refusal alone (`launch.sh start`, where the engine's log gives the warning)."""
    if settings.SPECULATIVE == "ngram":
        return None  # prompt lookup is never refused: no child process
    return speculative_verdict(settings)[0]
