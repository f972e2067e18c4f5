"""Rank 0's helper models: each setting (EMBEDDING_MODEL, RERANK_MODEL) resolved as MODEL is (a folder, a repo id
in the cache, a zoo name), its family picked from config.json (engine/helpers/families), loaded and evaluated.

Loaded before the ranks first report their memory, so rank 0's active memory holds the helpers' weights from the
start: KV_MEMORY_BYTES=-1 and PROMPT_CACHE_BYTES=-1 size themselves from what is left after them
(engine/rank0/kv_budget.py memory_left).
"""

from __future__ import annotations

import importlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from config import Settings
from engine.helpers.base import Helper
from engine.helpers.families import FAMILIES
from engine.model import ZOO_PREFIX, ModelError, load_errors_explained, resolve
from ipc.messages import HelperState

log = logging.getLogger(__name__)

SETTINGS = {"embedding": "EMBEDDING_MODEL", "rerank": "RERANK_MODEL"}


@dataclass
class Loaded:
    """A helper, where it came from, and which family read it."""

    helper: Helper
    family: str
    path: Path
    weight_bytes: int

    def state(self, rank: int = 0) -> HelperState:
        h = self.helper
        return HelperState(kind=h.kind, name=h.name, rank=rank, path=str(self.path), family=self.family,
                           max_tokens=h.max_tokens, dimensions=h.dimensions, matryoshka=h.matryoshka,
                           weight_bytes=self.weight_bytes)


def configured(settings: Settings) -> dict[str, str]:
    """kind -> the setting's value, for the helpers settings name."""
    return {kind: getattr(settings, name).strip() for kind, name in SETTINGS.items() if getattr(settings, name).strip()}


def served_name(value: str) -> str:
    """What /v1/models lists for a helper: a folder's last part, else the value as given (as MODEL's name)."""
    return value.rstrip("/").rsplit("/", 1)[-1] if value.startswith(("/", ".", "~")) else value


def resolve_helper(settings: Settings, setting: str, value: str) -> Path:
    """The folder of a helper setting's value; ModelError naming the setting."""
    if value.startswith(ZOO_PREFIX):
        from engine.zoo.store import HELPER_MODELS, ensure_helper_model

        name = value[len(ZOO_PREFIX):]
        if name not in HELPER_MODELS:
            raise ModelError(f"{setting}={value!r} is not a zoo helper model: use one of "
                             + ", ".join(ZOO_PREFIX + n for n in HELPER_MODELS))
        return ensure_helper_model(name, settings.model_cache_dir)
    try:
        return resolve(msgspec.structs.replace(settings, MODEL=value))
    except ModelError as exc:  # resolve's sentences name the setting it read
        raise ModelError(str(exc).replace("MODEL=", f"{setting}=", 1)) from exc


def family_for(config: dict[str, Any], kind: str, setting: str, value: str):
    """(name, module) of the first family of this kind that reads the config; ModelError when none does."""
    for name in FAMILIES:
        module = importlib.import_module(f"engine.helpers.families.{name}")
        if getattr(module, "KIND", kind) == kind and module.matches(config):
            return name, module
    raise ModelError(f"{setting}={value!r}: no {kind} family reads this model (config.json model_type "
                     f"{config.get('model_type')!r}); serve one of the families docs/helpers.md lists, or add one "
                     "(docs/extending.md)")


def load_one(settings: Settings, kind: str, value: str) -> Loaded:
    setting = SETTINGS[kind]
    path = resolve_helper(settings, setting, value)
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"{setting}={value!r}: cannot read {path / 'config.json'} ({exc}); give a model folder "
                         "with its config.json") from None
    family, module = family_for(config, kind, setting, value)
    try:
        with load_errors_explained(settings, path):
            helper = module.load(path, served_name(value))
    except ModelError as exc:
        raise ModelError(f"{setting}={value!r}: {exc}") from exc
    if helper.kind != kind:
        raise ModelError(f"{setting}={value!r} loads as a {helper.kind} model ({family}), not {kind}: name it in "
                         f"{SETTINGS[helper.kind]} instead")
    return Loaded(helper, family, path, helper.weight_bytes())


def load_helpers(settings: Settings) -> dict[str, Loaded]:
    """Every configured helper, by kind; raises ModelError in one sentence naming the setting."""
    loaded = {}
    for kind, value in configured(settings).items():
        one = loaded[kind] = load_one(settings, kind, value)
        log.info("helper %s: %s (%s, from %s), %.1f MiB, up to %d tokens%s", kind, one.helper.name, one.family,
                 one.path, one.weight_bytes / 2**20, one.helper.max_tokens,
                 f", {one.helper.dimensions} dimensions" if one.helper.dimensions else "")
    return loaded
