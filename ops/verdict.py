"""A verdict asked of a child process: ops never imports MLX, so what only mlx-lm can tell (can the ranks run
this model, can this speculation run) comes from `python -m <module>`, which prints its verdict as the last line
of JSON and exits with REFUSED when the answer is no.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping

from config import REPO_ROOT

REFUSED = 3  # engine.sharding.VERDICT_REFUSED and engine.speculative.preflight.VERDICT_REFUSED
WARNED = 5  # engine.verdicts.VERDICT_WARNED: it runs, but not as asked


def child_verdict(args: list[str], timeout: float, env: Mapping[str, str] | None = None) -> tuple[int | None, str]:
    """(verdict, sentence) of `python <args>`; (None, "") when it cannot tell (it failed, ran past `timeout`,
    or printed no verdict). env: the child's environment (default ours)."""
    try:
        r = subprocess.run([sys.executable, *args], cwd=REPO_ROOT, capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL, env=env)
        answer = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None, ""
    code = answer.get("verdict")
    return (code, str(answer.get("text", ""))) if code == r.returncode else (None, "")


def child_refusal(args: list[str], timeout: float, env: Mapping[str, str] | None = None) -> str | None:
    """The sentence `python <args>` refuses with; None when it accepts, or when it cannot tell: the engine's own
    load then says what is wrong. env: the child's environment (default ours)."""
    code, text = child_verdict(args, timeout, env)
    return text if code == REFUSED else None
