"""Can SPECULATIVE run with these models? Asked by `launch.sh check` and before `launch.sh start`, in a child
process (ops never imports MLX), with the same answers the engine applies when it builds rank 0's proposer: a
draft model of another tokenizer, a model without multi-token-prediction heads. Only tokenizers and configs are
read, no weights. A model whose caches cannot roll back a draft (a sliding window) is warned of:
it serves, decoding plainly, as its engine log says at start. Prints one JSON line {"verdict", "text"} and exits
with the verdict.
"""

from __future__ import annotations

import importlib
import sys

import msgspec

from config import Settings

from engine.verdicts import VERDICT_OK, VERDICT_REFUSED, VERDICT_UNKNOWN, VERDICT_WARNED, answer


def verdict(settings: Settings) -> tuple[int, str]:
    mode = settings.SPECULATIVE
    if mode == "off":
        return VERDICT_OK, mode
    from engine.mlx_compat import local_model_path
    from engine.model import ModelError, resolve

    try:
        target = local_model_path(str(resolve(settings)), download=False)
    except (ModelError, OSError, ValueError) as exc:
        return VERDICT_UNKNOWN, f"SPECULATIVE={mode} cannot be checked here: {exc}"
    code, text = (VERDICT_OK, mode) if mode == "ngram" else _proposer(settings, target)  # prompt lookup needs no model
    if code != VERDICT_OK:
        return code, text
    return _decodes_plainly(settings, target) or (code, text)


def _proposer(settings: Settings, target) -> tuple[int, str]:
    """Whether the proposer SPECULATIVE names can be built for this model (draft, mtp)."""
    from engine.model import ModelError, resolve

    mode = settings.SPECULATIVE
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


def _decodes_plainly(settings: Settings, target) -> tuple[int, str] | None:
    """The warning when the model's caches cannot roll back a rejected draft, asked of the model built lazily (no
    weight is read) as the engine asks it at start (engine.speculative.choose.cannot_verify); None when they can."""
    from engine.model import ModelError, remote_code
    from engine.pipeline_llama import load_model
    from engine.speculative.choose import cannot_verify

    try:
        model, _ = load_model(target, lazy=True, strict=False, **remote_code(settings))
    except (ModelError, OSError, ValueError, KeyError):
        return None  # the parallel verdict and the engine's load say what is wrong with the model
    why = cannot_verify(model)
    if why is None:
        return None
    mode = settings.SPECULATIVE
    return VERDICT_WARNED, (f"SPECULATIVE={mode}: MODEL={settings.MODEL} decodes plainly, without speculation, since "
                            f"{why}; set SPECULATIVE=off")


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
