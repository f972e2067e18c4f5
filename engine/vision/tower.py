"""Rank 0's vision tower: the family module that matches the checkpoint, loaded with mlx-vlm's classes.

A Tower answers: marker (the text the chat template writes for an image), image_token and image_token_id (the
placeholder the processor repeats), weight_bytes, expansion(PIL image) -> str (what replaces the image's marker
before tokenizing, as the family's processor writes it), and features(PIL image) -> mx.array [n, hidden]: the rows
the language model embeds at the n placeholders of that expansion, in order.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx


def family(config: dict) -> str | None:
    """The vision family whose module matches config.json, or None for a text-only model."""
    from engine.vision.families import FAMILIES

    if not config.get("vision_config"):
        return None
    for name in FAMILIES:
        if importlib.import_module(f"engine.vision.families.{name}").matches(config):
            return name
    return None


def load_tower(folder: Path, config: dict) -> Any | None:
    name = family(config)
    if name is None:
        return None
    return importlib.import_module(f"engine.vision.families.{name}").load(folder, config)


def load_parts(folder: Path, config: dict, family: str, projector_class) -> tuple[Any, Any, Any, int]:
    """(mlx-vlm's config, tower, projector, their weight bytes) of a checkpoint of mlx-vlm's models.<family>."""
    from mlx_vlm.utils import update_module_configs

    module = importlib.import_module(f"mlx_vlm.models.{family}")
    cfg = update_module_configs(module.ModelConfig.from_dict(config), module, config, ["text", "vision"])
    vision, projector = module.VisionModel(cfg.vision_config), projector_class(cfg)
    parts = {"vision_tower.": vision, "multi_modal_projector.": projector}
    return cfg, vision, projector, load_prefixed(folder, parts, vision.sanitize)


def load_prefixed(folder: Path, parts: dict[str, Any], sanitize: Callable[[dict], dict] | None = None) -> int:
    """Load each module of `parts` from the checkpoint's tensors under its prefix (strictly); the bytes loaded."""
    weights: dict[str, mx.array] = {}
    for file in sorted(folder.glob("*.safetensors")):
        weights.update({k: v for k, v in mx.load(str(file)).items() if k.startswith(tuple(parts))})
    total = 0
    for prefix, module in parts.items():
        own = {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
        if sanitize is not None and prefix == next(iter(parts)):
            own = sanitize(own)
        module.load_weights(list(own.items()), strict=True)
        total += sum(v.nbytes for v in own.values())
    mx.eval([m.parameters() for m in parts.values()])
    return total
