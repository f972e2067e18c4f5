"""What `python -m engine.<check>` answers ops with (ops.verdict.child_refusal reads it): one JSON line
{"verdict", "text"} on stdout, and the verdict as the exit code."""

from __future__ import annotations

import json
from collections.abc import Callable

from config import Settings

# WARNED: it runs, but not as asked (the text says how, and the fix)
VERDICT_OK, VERDICT_REFUSED, VERDICT_UNKNOWN, VERDICT_WARNED = 0, 3, 4, 5


def answer(verdict: Callable[[Settings], tuple[int, str]]) -> int:
    """verdict of the settings (from the environment and .env), printed; a bad setting cannot be judged."""
    from config import ConfigError, load_settings

    try:
        settings = load_settings()
    except ConfigError as exc:
        code, text = VERDICT_UNKNOWN, str(exc)
    else:
        code, text = verdict(settings)
    print(json.dumps({"verdict": code, "text": text}))
    return code
