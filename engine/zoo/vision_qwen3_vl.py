"""zoo-qwen3_vl-vision: Qwen3-VL (a ViT whose patches merge 2 x 2, DeepStack features from two of its layers, a
Qwen3 text model with interleaved M-RoPE) from mlx-vlm's classes."""

from __future__ import annotations

from pathlib import Path

from engine.modelgen.tokenizer import ENDOFTEXT, IM_END
from engine.zoo.vision import CONTEXT
from engine.zoo.vision_qwen2_5_vl import END, HEADS, IMAGE, MAX_PIXELS, MERGE, PATCH, START, TEXT_HIDDEN, VIDEO, write

HEAD_DIM = 16


def config(vocab: dict[str, int]) -> dict:
    """config.json as a Qwen3-VL checkpoint has it (text and tower nested)."""
    size = len(vocab)
    vision = {"model_type": "qwen3_vl", "depth": 3, "hidden_size": 32, "intermediate_size": 64,
              "out_hidden_size": TEXT_HIDDEN, "num_heads": 2, "patch_size": PATCH, "spatial_merge_size": MERGE,
              "temporal_patch_size": 2, "num_position_embeddings": 64, "deepstack_visual_indexes": [0, 1],
              "in_channels": 3}
    text = {"model_type": "qwen3_vl_text", "hidden_size": TEXT_HIDDEN, "num_hidden_layers": 3,
            "intermediate_size": 128, "num_attention_heads": HEADS, "num_key_value_heads": 2, "head_dim": HEAD_DIM,
            "vocab_size": size, "rms_norm_eps": 1e-6, "rope_theta": 5000000.0, "max_position_embeddings": CONTEXT,
            "tie_word_embeddings": False,
            # interleaved M-RoPE: frequency pairs take the temporal, height and width positions in turn
            "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}}
    return {"model_type": "qwen3_vl", "architectures": ["Qwen3VLForConditionalGeneration"], "text_config": text,
            "vision_config": vision, "image_token_id": vocab[IMAGE], "video_token_id": vocab[VIDEO],
            "vision_start_token_id": vocab[START], "vision_end_token_id": vocab[END], "tie_word_embeddings": False,
            "bos_token_id": vocab[ENDOFTEXT], "eos_token_id": vocab[IM_END], "pad_token_id": vocab[ENDOFTEXT],
            "torch_dtype": "float32"}


def preprocessor() -> dict:
    """preprocessor_config.json as Qwen3-VL's (and Qwen3.5's) checkpoints have it."""
    return {"image_processor_type": "Qwen2VLImageProcessorFast", "processor_class": "Qwen3VLProcessor",
            "patch_size": PATCH, "merge_size": MERGE, "temporal_patch_size": 2,
            "size": {"shortest_edge": 4 * (PATCH * MERGE) ** 2, "longest_edge": MAX_PIXELS}, "do_rescale": True,
            "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True}


def generate(out: Path) -> dict:
    return write(out, "qwen3_vl", config, preprocessor())
