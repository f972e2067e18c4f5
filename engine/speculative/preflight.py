"""Can SPECULATIVE run with these models? Asked by `launch.sh check` and before `launch.sh start`, in a child
process (ops never imports MLX), with the same answers the engine applies when it builds rank 0's proposer: a
draft model of another tokenizer, a model without multi-token-prediction heads. Only tokenizers and configs are
read, no weights. Prints one JSON line {"verdict", "text"} and exits with the verdict.
"""

from __future__ import annotations

import importlib
import sys

import msgspec

from config import Settings

from engine.verdicts import VERDICT_OK, VERDICT_REFUSED, VERDICT_UNKNOWN, answer


def verdict(settings: Settings) -> tuple[int, str]:
    mode = settings.SPECULATIVE
    if mode in ("off", "ngram"):
        return VERDICT_OK, mode  # prompt lookup needs nothing of the model
    from engine.mlx_compat import local_model_path
    from engine.model import ModelError, resolve

    try:
        target = local_model_path(str(resolve(settings)), download=False)
    except (ModelError, OSError, ValueError) as exc:
        return VERDICT_UNKNOWN, f"SPECULATIVE={mode} cannot be checked here: {exc}"
    draft = None
    if mode == "draft":
        try:  # resolve's sentences name the setting it read: here, DRAFT_MODEL
            draft = resolve(msgspec.structs.replace(settings, MODEL=settings.DRAFT_MODEL))
        except ModelError as exc:
            return VERDICT_REFUSED, str(exc).replace("MODEL=", "DRAFT_MODEL=", 1)
    module = _module(mode)
    if isinstance(module, str):
        return VERDICT_REFUSED, module
    if draft is not None:
        return _tokenizers(settings, module, target, draft)
    refusal = getattr(module, "mtp_refusal", None)  # (model folder) -> the sentence why it cannot, or None
    if refusal is None:
        return VERDICT_UNKNOWN, "SPECULATIVE=mtp: whether this model has usable MTP heads is told when it loads"
    why = refusal(target)
    return (VERDICT_REFUSED, why) if why else (VERDICT_OK, mode)


def _module(mode: str):
    """The proposer's module, or the sentence saying this build lacks it (as engine/speculative/choose.py)."""
    name = f"engine.speculative.{mode}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        return f"SPECULATIVE={mode} is not available in this build ({name} is missing); set SPECULATIVE=ngram or off"


def _tokenizers(settings: Settings, module, target, draft) -> tuple[int, str]:
    from mlx_lm.utils import load_tokenizer

    from engine.model import remote_code

    try:
        target_tok, draft_tok = (load_tokenizer(folder, remote_code(settings)) for folder in (target, draft))
    except Exception as exc:  # transformers raises anything on a broken folder
        return VERDICT_REFUSED, f"DRAFT_MODEL={settings.DRAFT_MODEL!r}: its tokenizer does not load: {exc}"
    why = module.tokenizer_mismatch(draft_tok, target_tok, settings.DRAFT_MODEL, settings.MODEL)
    return (VERDICT_REFUSED, why) if why else (VERDICT_OK, "draft")


def main() -> int:
    return answer(verdict)


if __name__ == "__main__":
    sys.exit(main())
