"""Where the vision tower lives, measured: the bytes of its weights (what every rank would hold were it copied to
each, as exo does; here rank 0 alone holds it), the bytes one image's features add to the plan (what the other
ranks receive instead), and the time an image adds to the first token.

Zoo rows (one rank, in process, on this machine): the tower and projector loaded as the engine loads them, the
features of a fresh picture timed through rank 0's path (decode, processor, tower, encoding for the plan), and the
first token of the same question with and without the picture through the engine's own batch (medians of --runs).
Real-shape rows: mlx-vlm's classes built from the published checkpoints' sizes without weights (bytes counted in
bfloat16 from the parameters' shapes), and one 1024 x 1024 picture's features; their times need the weights.

    .venv/bin/python -m bench.vision_tower [--runs 5]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import statistics
import time

# published sizes (config.json) of real checkpoints, by family: text hidden size, tower config, image tokens
GEMMA3 = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16,
          "patch_size": 14, "image_size": 896}
PIXTRAL = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
           "head_dim": 64, "patch_size": 14, "image_size": 1540}
QWEN3_VL = {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "patch_size": 16,
            "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 2304,
            "deepstack_visual_indexes": [8, 16, 24]}
REAL = (("Gemma 3 4B", "gemma3", 2560, GEMMA3), ("Gemma 3 27B", "gemma3", 5376, GEMMA3),
        ("Mistral Small 3.1 24B", "mistral3", 5120, PIXTRAL), ("Qwen3-VL 8B", "qwen3_vl", 4096, QWEN3_VL))
BF16 = 2


def picture(seed: int, height: int = 48, width: int = 64) -> dict:
    """A canonical image part (as the gateway sends) of a PNG that differs per seed."""
    import numpy as np
    from PIL import Image

    pixels = (np.arange(height * width * 3).reshape(height, width, 3) * (seed * 2 + 1) % 251).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    data = out.getvalue()
    return {"type": "image", "sha256": hashlib.sha256(data).hexdigest(), "media_type": "image/png",
            "width": width, "height": height, "data": data}


def first_token_seconds(batch, tokens: list[int], images) -> float:
    from engine.lockstep.plan import Insert, Plan

    rid = f"r{time.monotonic_ns()}"
    started = time.perf_counter()
    batch.apply(Plan(step=1, fingerprint=0, token_check=0,
                     inserts=[Insert(rid=rid, tokens=tokens, max_tokens=1, images=images)]))
    while not batch.step().tokens:
        pass
    return time.perf_counter() - started


def zoo_row(name: str, runs: int) -> dict:
    from config import load_settings
    from engine.loading import load
    from engine.lockstep.batch import LockstepBatch
    from engine.rank0.admission import Prompter
    from engine.rank0.validate import Limits
    from engine.vision.load import vision_prompts

    settings = load_settings({"MODEL": f"zoo-{name}"}, None)
    loaded = load(settings, None)
    tok = loaded.tokenizer
    limits = Limits(vocab_size=len(tok), logits_size=loaded.vocab_size, context_length=loaded.context_length,
                    max_batch=4, max_queue=4, vision=True)
    prompter = Prompter(tok, limits, None, None, vision=vision_prompts(settings, loaded))
    batch = LockstepBatch(loaded.model, set(tok.eos_token_ids), 512, 4, None, images=loaded.image_table)
    question = {"type": "text", "text": "Describe the picture."}
    text_tokens = prompter.chat_tokens([{"role": "user", "content": [question]}], None, None)
    tower, with_image, without, rows = [], [], [], None
    for seed in range(runs):
        part = picture(100 + seed)
        started = time.perf_counter()
        tokens = prompter.chat_tokens([{"role": "user", "content": [question, part]}], None, None, images=True)
        tower.append(time.perf_counter() - started)
        rows = prompter.admission.vision.image_rows(tokens)
        with_image.append(first_token_seconds(batch, tokens, rows))
        without.append(first_token_seconds(batch, text_tokens, []))
    return {"model": f"zoo-{name}", "tower_bytes": prompter.vision.tower.weight_bytes,
            "image_tokens": rows[0].rows, "plan_bytes": len(rows[0].data),
            "tower_ms": statistics.median(tower) * 1e3,
            "added_ms": (statistics.median(with_image) - statistics.median(without)) * 1e3}


def real_row(label: str, family: str, text_hidden: int, vision: dict) -> dict:
    """Bytes only: the classes built lazily (nothing computed), counted from their parameters' shapes."""
    import importlib

    from mlx.utils import tree_flatten
    from mlx_vlm.utils import update_module_configs

    module = importlib.import_module(f"mlx_vlm.models.{family}")
    if family == "gemma3":
        config = {"model_type": "gemma3", "hidden_size": text_hidden, "mm_tokens_per_image": 256,
                  "text_config": {"model_type": "gemma3_text", "hidden_size": text_hidden, "num_hidden_layers": 1,
                                  "intermediate_size": 1, "mm_tokens_per_image": 256},
                  "vision_config": {"model_type": "siglip_vision_model", **vision}}
        from mlx_vlm.models.gemma3.gemma3 import Gemma3MultiModalProjector as Projector
        tokens = 256
    elif family == "qwen3_vl":  # the merger is the tower's last part; DeepStack rows go with the input rows
        vision_tower = module.VisionModel(module.VisionConfig.from_dict({"out_hidden_size": text_hidden, **vision}))
        count = sum(v.size for _, v in tree_flatten(vision_tower.parameters()))
        tokens = (1024 // (vision["patch_size"] * 2)) ** 2
        columns = text_hidden * (1 + len(vision["deepstack_visual_indexes"]))
        return {"model": label, "tower_bytes": count * BF16, "image_tokens": tokens,
                "plan_bytes": tokens * columns * BF16, "tower_ms": None, "added_ms": None}
    else:
        config = {"model_type": "mistral3", "spatial_merge_size": 2,
                  "text_config": {"model_type": "mistral", "hidden_size": text_hidden, "num_hidden_layers": 1,
                                  "intermediate_size": 1, "num_attention_heads": 32, "rms_norm_eps": 1e-5,
                                  "vocab_size": 1},
                  "vision_config": {"model_type": "pixtral", **vision}}
        from mlx_vlm.models.mistral3.mistral3 import Mistral3MultiModalProjector as Projector
        tokens = (-(-1024 // (vision["patch_size"] * 2))) ** 2  # rows x columns of merged patches (ceiling)
    cfg = update_module_configs(module.ModelConfig.from_dict(config), module, config, ["text", "vision"])
    parts = (module.VisionModel(cfg.vision_config), Projector(cfg))
    count = sum(v.size for part in parts for _, v in tree_flatten(part.parameters()))
    return {"model": label, "tower_bytes": count * BF16, "image_tokens": tokens,
            "plan_bytes": tokens * text_hidden * BF16, "tower_ms": None, "added_ms": None}


def table(rows: list[dict]) -> str:
    def ms(v):
        return "-" if v is None else f"{v:.1f}"

    lines = ["| model | tower weights (MiB, each rank if copied) | image tokens | plan bytes per image (KiB) | "
             "tower per image (ms) | added to first token (ms) |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['tower_bytes'] / 2**20:.2f} | {r['image_tokens']} | "
                     f"{r['plan_bytes'] / 1024:.1f} | {ms(r['tower_ms'])} | {ms(r['added_ms'])} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    from engine.zoo.names import VISION_MODELS

    rows = [zoo_row(name, args.runs) for name in VISION_MODELS]
    rows += [real_row(*spec) for spec in REAL]
    print(table(rows))


if __name__ == "__main__":
    main()
