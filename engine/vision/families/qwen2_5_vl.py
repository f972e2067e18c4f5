"""Qwen2.5-VL: a windowed ViT over the picture at its own size (rounded to whole merged patches), patches merged
2 x 2 into one token each, so the count follows the picture; the template's <|image_pad|> repeats once per token.
Its image tokens take 3-D positions (M-RoPE), which engine/vision/mrope.py gives mlx-lm's Qwen2 text model."""

from __future__ import annotations

import importlib
from pathlib import Path

import mlx.core as mx

from engine.vision.tower import load_prefixed


def matches(config: dict) -> bool:
    return config.get("model_type") == "qwen2_5_vl" and bool(config.get("vision_config"))


def rotary(config: dict):
    """mlx-vlm's rotary embedding of this family's text model (M-RoPE over its mrope_section)."""
    from mlx_vlm.models.qwen2_5_vl.language import Qwen2RotaryEmbedding

    return text_rotary(Qwen2RotaryEmbedding, config)


def text_rotary(cls, config: dict):
    text = config.get("text_config") or config
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    return cls(head_dim, max_position_embeddings=text.get("max_position_embeddings", 128000),
               base=text.get("rope_theta", 1000000.0), rope_scaling=text.get("rope_scaling"))


class QwenVLTower:
    """A Qwen-VL tower of mlx-vlm's models.<package> (its VisionModel, its processor class)."""

    def __init__(self, folder: Path, config: dict, package: str, processor: str, processing: str = ""):
        module = importlib.import_module(f"mlx_vlm.models.{package}")
        processing = importlib.import_module(processing or f"mlx_vlm.models.{package}.processing_{package}")
        self.vision = module.VisionModel(module.VisionConfig.from_dict(config["vision_config"]))
        self.weight_bytes = load_prefixed(folder, {"vision_tower.": self.vision}, self.vision.sanitize)
        loaded = getattr(processing, processor).from_pretrained(str(folder))
        self.image_processor = loaded.image_processor
        self.marker = self.image_token = loaded.image_token
        self.image_token_id = loaded.image_token_id
        self.merge = self.image_processor.merge_size
        self.dtype = self.vision.patch_embed.proj.weight.dtype
        self._last = None  # (picture, its processor outputs)

    def _inputs(self, image):
        # expansion, grid and features each ask for the same picture in turn: process it once
        if self._last is None or self._last[0] is not image:
            self._last = (image, self.image_processor(images=[image]))
        return self._last[1]

    def grid(self, image) -> tuple[int, int]:
        """Rows and columns of the picture's image tokens."""
        _, h, w = (int(v) for v in self._inputs(image)["image_grid_thw"][0])
        return h // self.merge, w // self.merge

    def expansion(self, image) -> str:
        rows, columns = self.grid(image)
        return self.image_token * (rows * columns)

    def _tower(self, image):
        import numpy as np

        inputs = self._inputs(image)
        pixels = mx.array(np.asarray(inputs["pixel_values"])).astype(self.dtype)
        return self.vision(pixels, mx.array(np.asarray(inputs["image_grid_thw"])), output_hidden_states=False)

    def features(self, image) -> mx.array:
        """[image tokens, text hidden] for one PIL image, as mlx-vlm's get_input_embeddings makes them."""
        return self._tower(image)


def load(folder: Path, config: dict) -> QwenVLTower:
    return QwenVLTower(folder, config, "qwen2_5_vl", "Qwen2_5_VLProcessor")
