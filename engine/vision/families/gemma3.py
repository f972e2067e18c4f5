"""Gemma 3: a SigLIP tower, pooled to a fixed mm_tokens_per_image tokens per image, no M-RoPE.

mlx-vlm's Gemma3 model divides the projected features by sqrt(its config's hidden_size) before the language model
multiplies every input embedding by sqrt(text hidden_size); the rows here are scaled exactly as it scales them.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from engine.vision.tower import load_parts


def matches(config: dict) -> bool:
    return config.get("model_type") == "gemma3" and bool(config.get("vision_config"))


class Gemma3Tower:
    def __init__(self, folder: Path, config: dict):
        from mlx_vlm.models.gemma3.gemma3 import Gemma3MultiModalProjector
        from mlx_vlm.models.gemma3.processing_gemma3 import Gemma3Processor

        cfg, self.vision, self.projector, self.weight_bytes = load_parts(folder, config, "gemma3",
                                                                         Gemma3MultiModalProjector)
        processor = Gemma3Processor.from_pretrained(str(folder))
        self.image_processor = processor.image_processor
        self.marker = processor.boi_token  # what the chat template writes where an image goes
        self.full_sequence = processor.full_image_sequence  # what the processor writes in its place
        self.image_token, self.image_token_id = processor.image_token, processor.image_token_id
        self.tokens_per_image = processor.image_seq_length
        self.scale = cfg.hidden_size ** 0.5
        self.dtype = self.projector.mm_input_projection_weight.dtype

    def expansion(self, image) -> str:
        return self.full_sequence

    def features(self, image) -> mx.array:
        """[tokens_per_image, text hidden] rows for one PIL image, as mlx-vlm's get_input_embeddings makes them."""
        import numpy as np

        pixels = mx.array(np.asarray(self.image_processor([image])["pixel_values"]))
        hidden, _, _ = self.vision(pixels.transpose(0, 2, 3, 1).astype(self.dtype), output_hidden_states=True)
        return (self.projector(hidden) / self.scale)[0]


def load(folder: Path, config: dict) -> Gemma3Tower:
    return Gemma3Tower(folder, config)
