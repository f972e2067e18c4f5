"""zoo-mistral3-vision: Mistral 3 (Pixtral tower, patch merger, Llama-style text model) from mlx-vlm's classes."""

from __future__ import annotations

from pathlib import Path

from engine.modelgen.store import write_json
from engine.modelgen.tokenizer import ENDOFTEXT, IM_END, quiet_ids, write_tokenizer
from engine.zoo.vision import CONTEXT, VOCAB, template

IMG, BREAK, END = "[IMG]", "[IMG_BREAK]", "[IMG_END]"
# pictures fit in 64 pixels (longest edge), in 4-pixel patches merged 2 x 2: at most 8 x 8 image tokens
LONGEST, PATCH, MERGE = 64, 4, 2
TEXT_HIDDEN = 64


def config(vocab: dict[str, int]) -> dict:
    size = len(vocab)
    text = {"model_type": "mistral", "hidden_size": TEXT_HIDDEN, "num_hidden_layers": 2, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": size,
            "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "max_position_embeddings": CONTEXT,
            "tie_word_embeddings": False}
    vision = {"model_type": "pixtral", "hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64,
              "num_attention_heads": 2, "head_dim": 16, "patch_size": PATCH, "image_size": LONGEST,
              "num_channels": 3, "rope_theta": 10000.0}
    return {"model_type": "mistral3", "architectures": ["Mistral3ForConditionalGeneration"], "text_config": text,
            "vision_config": vision, "vocab_size": size, "image_token_index": vocab[IMG], "spatial_merge_size": MERGE,
            "vision_feature_layer": -1, "multimodal_projector_bias": False, "projector_hidden_act": "gelu",
            "eos_token_id": [vocab[IM_END]], "pad_token_id": vocab[ENDOFTEXT], "torch_dtype": "float32"}


def generate(out: Path) -> dict:
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_vlm.models import mistral3
    from mlx_vlm.utils import update_module_configs

    from engine.zoo.weights import _value

    markers = ((IMG, True), (BREAK, True), (END, True))
    vocab = write_tokenizer(out, VOCAB, 0, CONTEXT, extra=markers, template=template(IMG))
    write_json(out / "preprocessor_config.json", {
        "image_processor_type": "PixtralImageProcessor", "size": {"longest_edge": LONGEST},
        "patch_size": {"height": PATCH, "width": PATCH}, "do_resize": True, "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711], "do_convert_rgb": True, "resample": 3})
    write_json(out / "processor_config.json", {
        "processor_class": "PixtralProcessor", "image_token": IMG, "image_break_token": BREAK,
        "image_end_token": END, "patch_size": PATCH, "spatial_merge_size": MERGE})
    cfg = config(vocab)
    model = mistral3.Model(update_module_configs(mistral3.ModelConfig.from_dict(cfg), mistral3, cfg,
                                                 ["text", "vision"]))
    quiet = quiet_ids(vocab, tuple(text for text, _ in markers))

    def draw(name: str, shape: tuple[int, ...]):
        if len(shape) == 1 and "bias" not in name:  # every vector of these classes is a norm's scale
            return np.ones(shape, dtype=np.float32)
        return _value("mistral3-vision", name, shape, TEXT_HIDDEN, quiet)

    params = sorted(tree_flatten(model.parameters()))
    model.update(tree_unflatten([(n, mx.array(draw(n, tuple(p.shape)))) for n, p in params]))
    tensors = dict(sorted(tree_flatten(model.parameters())))
    mx.save_safetensors(str(out / "model.safetensors"), tensors, metadata={"format": "mlx"})
    write_json(out / "config.json", cfg)
    return {"model_type": "mistral3", "vocab_size": len(vocab), "eos_token_id": vocab[IM_END],
            "parameters": sum(v.size for v in tensors.values()), "dtype": "float32", "quantization": None}

