"""Can EMBEDDING_MODEL and RERANK_MODEL load? Asked by `launch.sh check` and before `launch.sh start`, in a child
process (ops never imports MLX): each resolved as the engine resolves it and its family picked from its config.json,
no weights read. Prints one JSON line {"verdict", "text"} and exits with it.
"""

from __future__ import annotations

import json
import sys

from config import Settings
from engine.verdicts import VERDICT_OK, VERDICT_REFUSED, answer


def verdict(settings: Settings) -> tuple[int, str]:
    from engine.helpers.load import SETTINGS, configured, families_for, resolve_helper
    from engine.model import ModelError

    found = []
    for kind, value in configured(settings).items():
        setting = SETTINGS[kind]
        try:
            path = resolve_helper(settings, setting, value)
            config = json.loads((path / "config.json").read_text())
            family = families_for(config, kind, setting, value)[0][0]
        except ModelError as exc:
            return VERDICT_REFUSED, str(exc)
        except (OSError, ValueError) as exc:
            return VERDICT_REFUSED, f"{setting}={value!r}: cannot read its config.json ({exc}); give a model folder"
        found.append(f"{kind} {value} ({family})")
    return VERDICT_OK, ", ".join(found) or "none"


def main() -> int:
    return answer(verdict)


if __name__ == "__main__":
    sys.exit(main())
