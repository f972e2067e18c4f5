"""zoo-gemma3-vision: Gemma 3 (SigLIP tower, pooled to mm_tokens_per_image tokens) from mlx-vlm's classes."""

from __future__ import annotations

import json
from pathlib import Path

from engine.modelgen.store import write_json
from engine.modelgen.tokenizer import ENDOFTEXT, IM_END, quiet_ids, write_tokenizer
from engine.zoo.vision import CONTEXT, VOCAB, template

# Gemma 3's image markers; the processor expands each <start_of_image> the template writes into
# "\n\n<start_of_image>" + <image_soft_token> * mm_tokens_per_image + "<end_of_image>\n\n".
BOI, EOI, IMAGE = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
# Small but real shapes: 64-pixel images in 4-pixel patches (16 x 16), pooled to 4 x 4 = 16 image tokens.
IMAGE_SIZE, PATCH, TOKENS_PER_IMAGE = 64, 4, 16
TEXT_HIDDEN, VISION_HIDDEN = 64, 32


def config(vocab: dict[str, int]) -> dict:
    """config.json as a Gemma 3 checkpoint has it (the keys mlx-vlm's and mlx-lm's gemma3 read); its heads divide
    by 2 ranks, as every Gemma 3 vision checkpoint's do."""
    size = len(vocab)
    text = {"model_type": "gemma3_text", "hidden_size": TEXT_HIDDEN, "num_hidden_layers": 2,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "vocab_size": size, "query_pre_attn_scalar": 16, "sliding_window": 512, "sliding_window_pattern": 2,
            "max_position_embeddings": CONTEXT, "mm_tokens_per_image": TOKENS_PER_IMAGE, "rms_norm_eps": 1e-6}
    vision = {"model_type": "siglip_vision_model", "hidden_size": VISION_HIDDEN, "num_hidden_layers": 2,
              "intermediate_size": 64, "num_attention_heads": 2, "patch_size": PATCH, "image_size": IMAGE_SIZE,
              "num_channels": 3, "layer_norm_eps": 1e-6}
    return {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
            "text_config": text, "vision_config": vision, "vocab_size": size,
            "image_token_index": vocab[IMAGE], "boi_token_index": vocab[BOI], "eoi_token_index": vocab[EOI],
            "mm_tokens_per_image": TOKENS_PER_IMAGE, "hidden_size": TEXT_HIDDEN, "pad_token_id": vocab[ENDOFTEXT],
            "eos_token_id": [vocab[IM_END]], "torch_dtype": "float32"}


def _draw(name: str, shape: tuple[int, ...], quiet: list[int]):
    """The zoo's draw (engine/zoo/weights.py), with Gemma's scales: its RMSNorms multiply by 1 + weight, and the
    model multiplies token embeddings by sqrt(hidden), so both start where unit-sized activations need them."""
    import numpy as np

    from engine.zoo.weights import _value

    value = _value("gemma3-vision", name, shape, TEXT_HIDDEN, quiet)
    if "norm" in name and len(shape) == 1 and "vision_tower" not in name:
        # the layers' outputs outweigh the token's own embedding, which the tied output would otherwise repeat
        return np.full(shape, 4.0 if "post_" in name else 0.0, dtype=np.float32)
    if name.endswith("embed_tokens.weight"):
        return value / np.float32(TEXT_HIDDEN ** 0.5)
    return value


def generate(out: Path) -> dict:
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_vlm.models import gemma3
    from mlx_vlm.utils import update_module_configs

    markers = ((BOI, True), (EOI, True), (IMAGE, True))
    vocab = write_tokenizer(out, VOCAB, 0, CONTEXT, extra=markers, template=template(BOI))
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    # transformers reads these into tokenizer.boi_token / image_token / image_token_id, which the processor uses
    tokenizer_config["extra_special_tokens"] = {"boi_token": BOI, "eoi_token": EOI, "image_token": IMAGE}
    write_json(out / "tokenizer_config.json", tokenizer_config)
    write_json(out / "preprocessor_config.json", {
        "image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor",
        "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE}, "resample": 2, "do_resize": True,
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True, "do_pan_and_scan": False})
    write_json(out / "processor_config.json",
               {"processor_class": "Gemma3Processor", "image_seq_length": TOKENS_PER_IMAGE})
    cfg = config(vocab)
    model = gemma3.Model(update_module_configs(gemma3.ModelConfig.from_dict(cfg), gemma3, cfg, ["text", "vision"]))
    quiet = quiet_ids(vocab, tuple(text for text, _ in markers))
    params = sorted(tree_flatten(model.parameters()))
    model.update(tree_unflatten([(n, mx.array(_draw(n, tuple(p.shape), quiet))) for n, p in params]))
    # Gemma 3 ties its output to the embedding: mlx-vlm always does, mlx-lm does where lm_head is absent
    tensors = {n: v for n, v in sorted(tree_flatten(model.parameters())) if not n.endswith("lm_head.weight")}
    mx.save_safetensors(str(out / "model.safetensors"), tensors, metadata={"format": "mlx"})
    write_json(out / "config.json", cfg)
    return {"model_type": "gemma3", "vocab_size": len(vocab), "eos_token_id": vocab[IM_END],
            "parameters": sum(v.size for v in tensors.values()), "dtype": "float32", "quantization": None}

