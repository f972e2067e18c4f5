"""zoo-qwen2_5_vl-vision: Qwen2.5-VL (a windowed ViT whose patches merge 2 x 2, a Qwen2 text model with M-RoPE)
from mlx-vlm's classes. Its image tokens take 3-D positions (engine/vision/mrope.py): the answer depends on them."""

from __future__ import annotations

from pathlib import Path

from engine.modelgen.store import write_json
from engine.modelgen.tokenizer import ENDOFTEXT, IM_END, quiet_ids, write_tokenizer
from engine.zoo.vision import CONTEXT, VOCAB, template

START, END, IMAGE, VIDEO = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
# pictures of at most 64 x 64 pixels in 4-pixel patches merged 2 x 2: a 64 x 48 picture is 8 x 6 image tokens
PATCH, MERGE, MAX_PIXELS = 4, 2, 64 * 64
TEXT_HIDDEN, HEADS = 64, 4


def config(vocab: dict[str, int]) -> dict:
    """config.json as a Qwen2.5-VL checkpoint has it: the text model's keys at the top, the tower's nested."""
    size = len(vocab)
    vision = {"model_type": "qwen2_5_vl", "depth": 2, "hidden_size": 32, "intermediate_size": 64,
              "out_hidden_size": TEXT_HIDDEN, "num_heads": 2, "patch_size": PATCH, "spatial_patch_size": PATCH,
              "spatial_merge_size": MERGE, "temporal_patch_size": 2, "window_size": 4 * PATCH * MERGE,
              "fullatt_block_indexes": [1], "in_channels": 3}
    head_dim = TEXT_HIDDEN // HEADS
    return {"model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"],
            "hidden_size": TEXT_HIDDEN, "num_hidden_layers": 2, "intermediate_size": 128,
            "num_attention_heads": HEADS, "num_key_value_heads": 2, "vocab_size": size, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "max_position_embeddings": CONTEXT, "tie_word_embeddings": False,
            # M-RoPE: of the head's frequency pairs, the first rotate by the temporal position, then height, width
            "rope_scaling": {"type": "default", "mrope_section": [head_dim // 8, 3 * head_dim // 16,
                                                                  3 * head_dim // 16]},
            "vision_config": vision, "image_token_id": vocab[IMAGE], "video_token_id": vocab[VIDEO],
            "vision_start_token_id": vocab[START], "vision_end_token_id": vocab[END],
            "bos_token_id": vocab[ENDOFTEXT], "eos_token_id": vocab[IM_END], "pad_token_id": vocab[ENDOFTEXT],
            "torch_dtype": "float32"}


def generate(out: Path) -> dict:
    return write(out, "qwen2_5_vl", config, {
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor",
        "patch_size": PATCH, "merge_size": MERGE, "temporal_patch_size": 2, "min_pixels": 4 * (PATCH * MERGE) ** 2,
        "max_pixels": MAX_PIXELS, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
        "do_convert_rgb": True})


def write(out: Path, family: str, config, preprocessor: dict) -> dict:
    """A Qwen-VL zoo model of mlx-vlm's models.<family>: the tokenizer with the vision markers, the processor's
    config, config(vocab) and random weights from mlx-vlm's own Model."""
    import importlib

    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_vlm.utils import update_module_configs

    from engine.zoo.weights import _value

    module = importlib.import_module(f"mlx_vlm.models.{family}")
    markers = ((START, True), (END, True), (IMAGE, True), (VIDEO, True))
    vocab = write_tokenizer(out, VOCAB, 0, CONTEXT, extra=markers, template=template(START + IMAGE + END))
    write_json(out / "preprocessor_config.json", preprocessor)
    cfg = config(vocab)
    read = dict(cfg)  # from_dict may add the text_config it reads to the dict, as mlx-vlm's load does
    model = module.Model(update_module_configs(module.ModelConfig.from_dict(read), module, read, ["text", "vision"]))
    quiet = quiet_ids(vocab, tuple(text for text, _ in markers))

    def draw(name: str, shape: tuple[int, ...]):
        if len(shape) == 1 and "bias" not in name:  # every vector of these classes but biases is a norm's scale
            return np.ones(shape, dtype=np.float32)
        return _value(f"{family}-vision", name, shape, TEXT_HIDDEN, quiet)

    params = sorted(tree_flatten(model.parameters()))
    model.update(tree_unflatten([(n, mx.array(draw(n, tuple(p.shape)))) for n, p in params]))
    tensors = dict(sorted(tree_flatten(model.parameters())))
    mx.save_safetensors(str(out / "model.safetensors"), tensors, metadata={"format": "mlx"})
    write_json(out / "config.json", cfg)
    return {"model_type": family, "vocab_size": len(vocab), "eos_token_id": vocab[IM_END],
            "parameters": sum(v.size for v in tensors.values()), "dtype": "float32", "quantization": None}
