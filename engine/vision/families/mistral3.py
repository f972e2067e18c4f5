"""Mistral 3: a Pixtral tower over the picture at its own aspect (longest edge capped), patches merged 2 x 2;
each row of [IMG] tokens ends in [IMG_BREAK], the last in [IMG_END], so the count follows the picture's size.
The language model is mlx-lm's Llama-style one; features go in unscaled, as mlx-vlm's Mistral3 puts them."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from engine.vision.tower import load_parts


def matches(config: dict) -> bool:
    return config.get("model_type") == "mistral3" and bool(config.get("vision_config"))


class Mistral3Tower:
    def __init__(self, folder: Path, config: dict):
        from mlx_vlm.models.mistral3.mistral3 import Mistral3MultiModalProjector
        from mlx_vlm.models.mistral3.processing_mistral3 import Mistral3Processor

        cfg, self.vision, self.projector, self.weight_bytes = load_parts(folder, config, "mistral3",
                                                                         Mistral3MultiModalProjector)
        self.layer = cfg.vision_feature_layer
        self.processor = Mistral3Processor.from_pretrained(str(folder))
        self.marker = self.image_token = self.processor.image_token
        self.image_token_id = self.processor.image_token_id

    def _inputs(self, image):
        p = self.processor
        return p.image_processor([image], patch_size=p.patch_size * p.spatial_merge_size)

    def expansion(self, image) -> str:
        """As Mistral3Processor writes it for this picture's size after resizing."""
        p = self.processor
        h, w = self._inputs(image)["image_sizes"][0]
        step = p.patch_size * p.spatial_merge_size
        rows = [p.image_token * (w // step)] * (h // step)
        return p.image_break_token.join(rows) + p.image_end_token

    def features(self, image) -> mx.array:
        """[image tokens, text hidden] for one PIL image, as mlx-vlm's get_input_embeddings makes them."""
        import numpy as np

        inputs = self._inputs(image)
        pixels = mx.array(np.asarray(inputs["pixel_values"]))
        sizes = inputs["image_sizes"]
        *_, hidden_states = self.vision(pixels.transpose(0, 2, 3, 1), output_hidden_states=True, image_sizes=sizes)
        selected = hidden_states[self.layer]
        if selected.ndim == 3 and selected.shape[0] == 1:
            selected = selected.squeeze(0)
        features = self.projector(selected, sizes)
        return features.squeeze(0) if features.ndim == 3 else features


def load(folder: Path, config: dict) -> Mistral3Tower:
    return Mistral3Tower(folder, config)
