"""zoo-qwen3_5-vision: Qwen3.5 (Qwen3-VL's tower without DeepStack; three Gated DeltaNet layers to one attention
layer whose rope turns a quarter of each head by M-RoPE positions) from mlx-vlm's classes."""

from __future__ import annotations

from pathlib import Path

from engine.modelgen.tokenizer import ENDOFTEXT, IM_END
from engine.zoo.vision import CONTEXT
from engine.zoo.vision_qwen2_5_vl import END, HEADS, IMAGE, START, TEXT_HIDDEN, VIDEO, write
from engine.zoo.vision_qwen3_vl import MERGE, PATCH, preprocessor

HEAD_DIM = 32


def config(vocab: dict[str, int]) -> dict:
    size = len(vocab)
    vision = {"model_type": "qwen3_5", "depth": 2, "hidden_size": 32, "intermediate_size": 64,
              "out_hidden_size": TEXT_HIDDEN, "num_heads": 2, "patch_size": PATCH, "spatial_merge_size": MERGE,
              "temporal_patch_size": 2, "num_position_embeddings": 64, "deepstack_visual_indexes": [],
              "in_channels": 3}
    layers = 4  # three linear attention layers to one attention layer, as in the real models
    text = {"model_type": "qwen3_5_text", "hidden_size": TEXT_HIDDEN, "num_hidden_layers": layers,
            "intermediate_size": 128, "num_attention_heads": HEADS, "num_key_value_heads": 2, "head_dim": HEAD_DIM,
            "vocab_size": size, "rms_norm_eps": 1e-6, "max_position_embeddings": CONTEXT,
            "tie_word_embeddings": False, "attention_bias": False, "attn_output_gate": True,
            "mtp_num_hidden_layers": 0, "full_attention_interval": 4,
            "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
            "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
            "linear_num_key_heads": 4, "linear_num_value_heads": 8,
            # the rope turns a quarter of each head (8 of 32), its 4 frequency pairs t, h, w, t interleaved
            "rope_parameters": {"rope_type": "default", "mrope_interleaved": True, "mrope_section": [2, 1, 1],
                                "rope_theta": 100.0, "partial_rotary_factor": 0.25}}
    return {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": text,
            "vision_config": vision, "image_token_id": vocab[IMAGE], "video_token_id": vocab[VIDEO],
            "vision_start_token_id": vocab[START], "vision_end_token_id": vocab[END], "tie_word_embeddings": False,
            "vocab_size": size, "bos_token_id": vocab[ENDOFTEXT], "eos_token_id": vocab[IM_END],
            "pad_token_id": vocab[ENDOFTEXT], "torch_dtype": "float32"}


def generate(out: Path) -> dict:
    return write(out, "qwen3_5", config, preprocessor())
