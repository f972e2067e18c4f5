"""How many prompt tokens one lockstep step may prefill: paced to the slowest rank, under the watchdog.

PREFILL_TOKENS_PER_STEP is a ceiling, not a pace: MLX's CPU build prefills even a 135M-parameter model at a
few tokens a second, so one 512-token chunk runs past WATCHDOG_TIMEOUT and the watchdog ends the engine.
At start every rank times a prefill of PROBE tokens on a throwaway cache (after a short warm-up), the ranks
take the slowest figure (all ranks must use the same chunk: they run the batch in lockstep), and the chunk is
the largest power of two whose estimated step stays within SHARE of the watchdog's deadline.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

WARM, PROBE = 2, 16  # tokens: a warm-up pass (kernels built, weights paged in), then the timed one; short, as a
# slow host pays them at every start (a fixed cost per pass only makes the estimate cautious)
SHARE = 0.25  # of WATCHDOG_TIMEOUT one step's prefill may take: room for decoding, sampling, a busy host
FLOOR = 16  # the least chunk (settings.PREFILL_TOKENS_PER_STEP's own minimum)


@dataclass(frozen=True)
class Pace:
    """The chunk every rank uses, and the slowest rank's measured prefill rate (0: not measured)."""

    chunk: int
    tokens_per_second: float


def paced_chunk(seconds_per_token: float, watchdog_timeout: float, ceiling: int) -> int:
    """The ceiling where it fits in SHARE of the deadline, else the largest power of two that does (at least
    FLOOR); the ceiling where the rate is unknown (0)."""
    if seconds_per_token <= 0:
        return ceiling
    fits = watchdog_timeout * SHARE / seconds_per_token
    if fits >= ceiling:
        return ceiling
    chunk = FLOOR
    while chunk * 2 <= fits:
        chunk *= 2
    return min(chunk, ceiling)


def agree(rows: list[list[int]], watchdog_timeout: float, ceiling: int) -> Pace:
    """The Pace from every rank's row (microseconds per token; 0: that rank could not measure): the slowest."""
    slowest = max(row[0] for row in rows) / 1e6
    return Pace(paced_chunk(slowest, watchdog_timeout, ceiling), 1 / slowest if slowest > 0 else 0.0)


def row(seconds_per_token: float) -> list[int]:
    """This rank's row for the plan channel's gather (int32s): microseconds per token, at least 1 when measured."""
    return [min(max(1, round(seconds_per_token * 1e6)), 2**31 - 1) if seconds_per_token > 0 else 0]


def seconds_per_token(model: Any) -> float:
    """This rank's prefill time per token: every rank runs the same passes (a sharded model's layers meet in
    their collectives); 0 where the model cannot prefill plain token ids."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    try:
        cache = make_prompt_cache(model)
        mx.eval(model(mx.array([list(range(1, WARM + 1))]), cache=cache))
        started = time.perf_counter()
        mx.eval(model(mx.array([list(range(WARM + 1, WARM + PROBE + 1))]), cache=cache))
        return (time.perf_counter() - started) / PROBE
    except Exception as exc:  # any model class: a failure only means "not measured", the ceiling applies
        log.warning("prefill pace: a %d-token prefill failed (%r); prefilling PREFILL_TOKENS_PER_STEP tokens per "
                    "step unmeasured", PROBE, exc)
        return 0.0
    finally:
        mx.clear_cache()
