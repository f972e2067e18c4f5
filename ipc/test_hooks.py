"""Test-only fault hooks, read only when MCS_TEST_HOOKS=1 (once, when a process starts).

Without the switch every hook reads as unset, so a stray ENGINE_FAILPOINT or MCS_SPREAD_TEST_* in a serving
environment does nothing, and hot paths compare a constant None. The engine reports the switch in Info.test_hooks
and /health says so; ops forwards the hooks to other hosts' ranks only with it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

SWITCH = "MCS_TEST_HOOKS"
# ENGINE_FAILPOINT: engine/decoding/sampling.py; MCS_SPREAD_TEST_*: engine/spread/hooks.py;
# MCS_LINKS_TEST_EXIT: engine/link_check.py (the API's own, never forwarded: MCS_IMAGE_FETCH_ALLOW_LOOPBACK,
# api/images/resolve.py)
HOOKS = ("ENGINE_FAILPOINT", "MCS_SPREAD_TEST_FREE_BYTES", "MCS_SPREAD_TEST_PAUSE", "MCS_SPREAD_TEST_EXIT",
         "MCS_LINKS_TEST_EXIT")
ENABLED = os.environ.get(SWITCH) == "1"


def hook(name: str, environ: Mapping[str, str] | None = None) -> str:
    """The hook's value, or "" without the switch (that of this process's start, or of environ when given)."""
    if environ is None:
        return os.environ.get(name, "") if ENABLED else ""
    return environ.get(name, "") if environ.get(SWITCH) == "1" else ""


def forwarded(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The names a rank on another host must get: the switch and the hooks when the switch is on, else none."""
    return (SWITCH, *HOOKS) if environ.get(SWITCH) == "1" else ()
