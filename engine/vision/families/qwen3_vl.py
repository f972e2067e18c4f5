"""Qwen3-VL: Qwen2.5-VL's way of placing image tokens (patches merged 2 x 2, M-RoPE positions, interleaved over the
head's frequencies) plus DeepStack: the tower's features at a few of its layers go into the text model's first
layers at the image's tokens (engine/vision/deepstack.py). They travel as more columns of the image's rows."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from engine.vision.families.qwen2_5_vl import QwenVLTower, text_rotary


def matches(config: dict) -> bool:
    return config.get("model_type") == "qwen3_vl" and bool(config.get("vision_config"))


def rotary(config: dict):
    from mlx_vlm.models.qwen3_vl.language import Qwen3VLRotaryEmbedding

    return text_rotary(Qwen3VLRotaryEmbedding, config)


def deepstack_levels(config: dict) -> int:
    return len(config["vision_config"].get("deepstack_visual_indexes") or ())


class Qwen3VLTower(QwenVLTower):
    def features(self, image) -> mx.array:
        """[image tokens, text hidden x (1 + DeepStack levels)]: the input rows, then each level's."""
        rows, deep = self._tower(image)
        return mx.concatenate([rows, *deep], axis=-1)


def load(folder: Path, config: dict) -> Qwen3VLTower:
    return Qwen3VLTower(folder, config, "qwen3_vl", "Qwen3VLProcessor")
