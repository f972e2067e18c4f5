"""Qwen2.5-VL: a windowed ViT over the picture at its own size (rounded to whole merged patches), patches merged
2 x 2 into one token each, so the count follows the picture; the template's <|image_pad|> repeats once per token.
Its image tokens take 3-D positions (M-RoPE), which engine/vision/mrope.py gives mlx-lm's Qwen2 text model."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from engine.vision.tower import load_prefixed


def matches(config: dict) -> bool:
    return config.get("model_type") == "qwen2_5_vl" and bool(config.get("vision_config"))


def rotary(config: dict):
    """mlx-vlm's rotary embedding of this family's text model (M-RoPE over its mrope_section)."""
    from mlx_vlm.models.qwen2_5_vl.language import Qwen2RotaryEmbedding

    text = config.get("text_config") or config
    return Qwen2RotaryEmbedding(text["hidden_size"] // text["num_attention_heads"],
                                max_position_embeddings=text.get("max_position_embeddings", 128000),
                                base=text.get("rope_theta", 1000000.0), rope_scaling=text.get("rope_scaling"))


class Qwen25VLTower:
    def __init__(self, folder: Path, config: dict):
        from mlx_vlm.models.qwen2_5_vl import VisionModel
        from mlx_vlm.models.qwen2_5_vl.config import VisionConfig
        from mlx_vlm.models.qwen2_5_vl.processing_qwen2_5_vl import Qwen2_5_VLProcessor

        self.vision = VisionModel(VisionConfig.from_dict(config["vision_config"]))
        self.weight_bytes = load_prefixed(folder, {"vision_tower.": self.vision}, self.vision.sanitize)
        processor = Qwen2_5_VLProcessor.from_pretrained(str(folder))
        self.image_processor = processor.image_processor
        self.marker = self.image_token = processor.image_token
        self.image_token_id = processor.image_token_id
        self.merge = self.image_processor.merge_size
        self.dtype = self.vision.patch_embed.proj.weight.dtype

    def _inputs(self, image):
        return self.image_processor(images=[image])

    def grid(self, image) -> tuple[int, int]:
        """Rows and columns of the picture's image tokens."""
        _, h, w = (int(v) for v in self._inputs(image)["image_grid_thw"][0])
        return h // self.merge, w // self.merge

    def expansion(self, image) -> str:
        rows, columns = self.grid(image)
        return self.image_token * (rows * columns)

    def features(self, image) -> mx.array:
        """[image tokens, text hidden] for one PIL image, as mlx-vlm's get_input_embeddings makes them."""
        import numpy as np

        inputs = self._inputs(image)
        pixels = mx.array(np.asarray(inputs["pixel_values"])).astype(self.dtype)
        return self.vision(pixels, mx.array(np.asarray(inputs["image_grid_thw"])), output_hidden_states=False)


def load(folder: Path, config: dict) -> Qwen25VLTower:
    return Qwen25VLTower(folder, config)
