"""Would MODEL load on this host? Asked by `launch.sh switch` in a child process (ops never imports MLX) before
it stops the running engine, so a model that cannot load costs no outage.

What rank 0's own load checks, in its words (engine.model): the folder's files, the model built lazily and
matched strictly against the weights' headers (no weight is read), the tokenizer built. Prints one JSON line
{"verdict", "text"} and exits with the verdict.

    python -m engine.loadcheck
"""

from __future__ import annotations

import sys

from config import Settings
from engine.verdicts import VERDICT_OK, VERDICT_REFUSED, answer


def verdict(settings: Settings) -> tuple[int, str]:
    """(VERDICT_*, sentence): the sentence the engine would fail with, or where the model was found."""
    from mlx_lm.utils import load_model, load_tokenizer

    from engine.model import ModelError, load_errors_explained, refuse_broken_folder, remote_code, resolve

    try:
        target = resolve(settings, rank=0)
        refuse_broken_folder(settings, target)
        with load_errors_explained(settings, target):
            _, config = load_model(target, lazy=True, strict=True, **remote_code(settings))
            load_tokenizer(target, remote_code(settings), eos_token_ids=config.get("eos_token_id"))
    except ModelError as exc:
        return VERDICT_REFUSED, str(exc)
    return VERDICT_OK, f"MODEL={settings.MODEL} loads from {target}"


if __name__ == "__main__":
    sys.exit(answer(verdict))
