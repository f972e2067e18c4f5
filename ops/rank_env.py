"""What the ranks mlx.launch starts must be told: over ssh they inherit none of our environment.

Every setting set in the environment travels as the user wrote it (before resolution), so each rank resolves
the same settings as rank 0, and so do the Hugging Face and MLX variables set there (HF_HOME and HF_HUB_CACHE
say where a rank finds the model; MLX_* tune MLX, e.g. MLX_METAL_FAST_SYNCH). mlx.launch writes them into the
command line of every rank and the supervisor logs that line, so secrets never travel: API_KEY (only the API
needs it) and HF_TOKEN (ranks never reach the Hub: `download` fetches on rank 0's host and spreads the files).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from config import Settings
from ipc import test_hooks

PREFIXES = ("HF_", "MLX_")
# mlx.launch sets these for each rank itself; ours must never stand in for them
LAUNCHER_SET = frozenset({"MLX_RANK", "MLX_HOSTFILE", "MLX_JACCL_COORDINATOR", "MLX_JACCL_RING", "MLX_IBV_DEVICES",
                          "MLX_WORLD_SIZE"})
SECRETS = frozenset({"API_KEY", "HF_TOKEN"})


def forwarded(settings: Settings, environ: Mapping[str, str] = os.environ, extra: Iterable[str] = ()) -> list[str]:
    """The names of environ that go to every rank: settings, HF_* and MLX_* variables, `extra`, and the test hooks
    under MCS_TEST_HOOKS=1."""
    names = {*type(settings).__struct_fields__, *extra, *test_hooks.forwarded(environ)}
    return sorted(key for key in environ if (key in names or key.startswith(PREFIXES))
                  and key not in SECRETS and key not in LAUNCHER_SET)


def env_args(settings: Settings, environ: Mapping[str, str] = os.environ, extra: Iterable[str] = ()) -> list[str]:
    """mlx.launch's `--env NAME=value` arguments for forwarded()."""
    return [arg for key in forwarded(settings, environ, extra) for arg in ("--env", f"{key}={environ[key]}")]
