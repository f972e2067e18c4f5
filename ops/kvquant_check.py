"""Can KV_BITS be applied to MODEL? Asked before `launch.sh start` and in `launch.sh check`.

A model whose cache kinds KV_BITS cannot quantize (attention with sinks, vectors no group size divides) would otherwise
end every rank at load, with the reason only in engine.log. The answer comes from `python -m
engine.kvquant.preflight` in a child process (ops never imports MLX), in the engine's own sentence.
"""

from __future__ import annotations

from config import Settings
from ops.verdict import child_refusal

VERDICT_TIMEOUT = 120  # seconds: importing mlx-lm and building the model's class without weights


def kv_quant_refusal(settings: Settings) -> str | None:
    """The sentence saying why KV_BITS cannot be applied to MODEL; None when it can, when KV_BITS is off (no
    child process), or when this host cannot tell (the model is not here: the engine says at load)."""
    if settings.kv_bits is None:
        return None
    return child_refusal(["-m", "engine.kvquant.preflight"], VERDICT_TIMEOUT)
