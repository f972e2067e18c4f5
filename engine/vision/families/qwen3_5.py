"""Qwen3.5/3.6: Qwen3-VL's tower and processor without DeepStack, and a text model of linear attention layers
(Gated DeltaNet, no positions) and attention layers whose rope turns the first quarter of each head by interleaved
M-RoPE positions (engine/vision/mrope.py)."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from engine.vision.families.qwen2_5_vl import QwenVLTower


def matches(config: dict) -> bool:
    return config.get("model_type") == "qwen3_5" and bool(config.get("vision_config"))


def rotary(config: dict):
    from mlx_vlm.models.qwen3_5.language import Qwen3_5RotaryEmbedding

    text = config["text_config"]
    rope = text["rope_parameters"]
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    return Qwen3_5RotaryEmbedding(int(head_dim * rope["partial_rotary_factor"]),
                                  max_position_embeddings=text["max_position_embeddings"], base=rope["rope_theta"],
                                  mrope_section=rope["mrope_section"])


class Qwen35Tower(QwenVLTower):
    def features(self, image) -> mx.array:
        return self._tower(image)[0]  # its DeepStack levels are off


def load(folder: Path, config: dict) -> Qwen35Tower:
    return Qwen35Tower(folder, config, "qwen3_5", "Qwen3VLProcessor", "mlx_vlm.models.qwen3_vl.processing_qwen3_vl")
