"""Where the vision path joins loading: the embedding hook on every rank, the tower on rank 0."""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any

from engine.vision.table import FeatureTable, install
from engine.vision.tower import family, load_tower

log = logging.getLogger(__name__)


def image_hook(model: Any, config: dict) -> FeatureTable | None:
    """Every rank: a vision-language model's embedding reads image features from the table returned."""
    name = family(config)
    if name is None:
        return None
    table = FeatureTable()
    if not install(model, table):
        return None
    module = importlib.import_module(f"engine.vision.families.{name}")
    if hasattr(module, "rotary"):  # its image tokens take 3-D positions (M-RoPE)
        from engine.vision.mrope import install as install_mrope

        install_mrope(model, lambda attn: module.rotary(config), table)
    if getattr(module, "deepstack_levels", None) and module.deepstack_levels(config):
        from engine.vision.deepstack import install as install_deepstack

        install_deepstack(model, table, module.deepstack_levels(config))
    return table


def vision_prompts(settings: Any, loaded: Any):
    """Rank 0: the tower and the prompts' image handling, or None for a text-only model."""
    if loaded.image_table is None:
        return None
    from engine.vision.prompt import VisionPrompts

    prompts = VisionPrompts(lambda: load_tower(Path(loaded.path), loaded.config))
    log.info("vision tower (%s) loaded on rank 0: %.1f MiB", family(loaded.config), prompts.tower.weight_bytes / 2**20)
    return prompts
