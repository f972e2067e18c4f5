"""Can KV_BITS be applied to MODEL? Asked by `launch.sh check` and before `launch.sh start`, in a child process
(ops never imports MLX), with the decision the engine applies at load (engine/kvquant/kinds.py: refusal). Only the
model's config and classes are read, no weights. Prints one JSON line {"verdict", "text"} and exits with it.
"""

from __future__ import annotations

import sys

from config import Settings
from engine.verdicts import VERDICT_OK, VERDICT_REFUSED, VERDICT_UNKNOWN, answer


def verdict(settings: Settings) -> tuple[int, str]:
    if settings.kv_bits is None:
        return VERDICT_OK, "off"
    from engine.kvquant.kinds import refusal
    from engine.mlx_compat import local_model_path
    from engine.model import ModelError, remote_code, resolve
    from engine.pipeline_llama import load_model

    try:
        path = local_model_path(str(resolve(settings)), download=False)
        model, _ = load_model(path, lazy=True, strict=False, **remote_code(settings))
    except (ModelError, OSError, ValueError, KeyError) as exc:
        return VERDICT_UNKNOWN, f"KV_BITS={settings.KV_BITS} cannot be checked here: {exc}"
    why = refusal(model, settings.kv_bits, settings.KV_GROUP_SIZE)
    return (VERDICT_REFUSED, why) if why else (VERDICT_OK, f"{settings.KV_BITS} bits")


def main() -> int:
    return answer(verdict)


if __name__ == "__main__":
    sys.exit(main())
