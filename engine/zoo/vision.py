"""Zoo vision-language models: tiny random-weight checkpoints built from mlx-vlm's own classes, written as a
Hugging Face-style folder that mlx-vlm loads whole (tower, projector, processor) and mlx-lm loads the text part of.

gemma3-vision (engine/zoo/vision_gemma3.py): a fixed number of image tokens per image, no M-RoPE; its text model
shards with engine/shard_gemma3.py. mistral3-vision (engine/zoo/vision_mistral3.py): a Pixtral tower whose token count
follows the picture's size (rows of [IMG] ending in [IMG_BREAK], then [IMG_END]) and a Llama-style text model that
mlx-lm shards. qwen2_5_vl-vision (engine/zoo/vision_qwen2_5_vl.py): a windowed ViT and a Qwen2 text model whose
image tokens take M-RoPE positions; qwen3_vl-vision (engine/zoo/vision_qwen3_vl.py) adds DeepStack;
qwen3_5-vision (engine/zoo/vision_qwen3_5.py) has linear attention layers and M-RoPE on part of each head.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from engine.modelgen.tokenizer import chat_template

# The demo tokenizer's vocabulary (engine/zoo/store.py VOCAB), so text token ids compare with the other zoo models.
VOCAB, CONTEXT = 1024, 4096


def generate(name: str, out: Path) -> dict:
    """Write every file of vision zoo model `name` (family-vision) into `out`; return the facts for its marker."""
    family = name.removesuffix("-vision")
    return importlib.import_module(f"engine.zoo.vision_{family}").generate(out)


def template(marker: str) -> str:
    """The zoo's ChatML template, with an image part rendered as the family's template renders it (its marker)."""
    text = "{%- if part is mapping and part.type == 'text' -%}{{- part.text -}}{%- endif -%}"
    image = ("{%- if part is mapping and part.type == 'text' -%}{{- part.text -}}"
             "{%- elif part is mapping and part.type == 'image' -%}{{- '" + marker + "' -}}{%- endif -%}")
    source = chat_template()
    if text not in source:
        raise RuntimeError("engine/modelgen/chat_template.jinja changed: update engine/zoo/vision.py")
    return source.replace(text, image)
