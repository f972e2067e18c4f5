"""Which proposer SPECULATIVE names, built on rank 0, and whether the model's caches can verify drafts at all."""

from __future__ import annotations

import importlib
import logging
from typing import Any

from engine.load_errors import ModelError
from engine.speculative.propose import Proposer

log = logging.getLogger(__name__)

# SPECULATIVE -> (module, class, what its absence means to the operator)
_PROPOSERS = {
    "draft": ("engine.speculative.draft", "DraftProposer", "a draft model"),
    "mtp": ("engine.speculative.mtp", "MtpProposer", "multi-token-prediction heads"),
}


def make_proposer(settings: Any, loaded_model: Any, tokenizer: Any) -> Proposer | None:
    """Rank 0's proposer for SPECULATIVE (None: off); raises ModelError with the sentence saying why it cannot."""
    mode = settings.SPECULATIVE
    if mode == "off":
        return None
    if mode == "ngram":
        from engine.speculative.ngram import NgramProposer

        return NgramProposer()
    module_name, class_name, what = _PROPOSERS[mode]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise ModelError(f"SPECULATIVE={mode} is not available in this build (proposing with {what} is missing: "
                         f"{module_name}); set SPECULATIVE=ngram or off") from None
    cls = getattr(module, class_name)
    if mode == "draft":
        return cls(settings, tokenizer)
    return cls(settings, loaded_model)


def cannot_verify(model: Any) -> str | None:
    """Why this rank's model cannot verify drafts (its caches cannot roll back a rejected suffix per sequence), or
    None when it can. Asks the verification's own answer; without it, nothing can verify."""
    try:
        from engine.speculative.rollback import can_verify
    except ImportError:
        return "this build cannot verify drafts (engine.speculative.rollback is missing)"
    answer = can_verify(model)
    if isinstance(answer, tuple):  # (ok, why)
        ok, why = answer
        return None if ok else str(why)
    if isinstance(answer, str):  # the reason, empty when it can
        return answer or None
    return None if answer else "its caches cannot roll back rejected drafts per sequence"
