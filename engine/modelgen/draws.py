"""Random weights that are identical on every platform: uniform draws keyed by tensor name."""

from __future__ import annotations

import math
import zlib

SEED = 0x6D6C78  # "mlx"


def uniform(name: str, shape: tuple[int, ...], std: float, low: float | None = None):
    """Float32 values of standard deviation `std` around zero (or uniform on [low, low + 2*sqrt(3)*std])."""
    import numpy as np

    # One stream per tensor, keyed by its name: a tensor's values do not depend on which other
    # tensors exist. Uniform rather than normal: numpy's normal sampler calls exp() and log(), and
    # libm may differ by an ulp between macOS and Linux; this is integer bits and IEEE arithmetic
    # (math.sqrt is correctly rounded everywhere, pow is not).
    rng = np.random.default_rng([SEED, zlib.crc32(name.encode())])
    width = std * math.sqrt(3.0)
    if low is None:
        return ((rng.random(shape, dtype=np.float64) * 2.0 - 1.0) * width).astype(np.float32)
    return (rng.random(shape, dtype=np.float64) * (2.0 * width) + low).astype(np.float32)
