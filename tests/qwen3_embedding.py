"""The in-process reference of a Qwen3-Embedding folder, computed the model card's way: mlx-lm's qwen3 model alone,
one input at a time, no batching: the final hidden state of the last token after <|endoftext|>, L2-normalized."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np


def reference(folder: str) -> Callable[[list[str]], tuple[np.ndarray, int]]:
    """texts -> ([n, dimensions] embeddings, tokens counted) from the model folder the engine loaded."""
    import mlx.core as mx
    from mlx_lm.models import qwen3
    from transformers import AutoTokenizer

    config = json.loads(Path(folder, "config.json").read_text())
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    model.load_weights([(f"model.{k}", v) for k, v in mx.load(f"{folder}/model.safetensors").items()])
    tok = AutoTokenizer.from_pretrained(folder)
    eos = tok.convert_tokens_to_ids("<|endoftext|>")

    def embed(texts: list[str]) -> tuple[np.ndarray, int]:
        rows, count = [], 0
        for text in texts:
            ids = tok.encode(text) + [eos]
            count += len(ids)
            last = model.model(mx.array([ids]))[0, -1].astype(mx.float32)
            rows.append(np.array(last / mx.linalg.norm(last)))
        return np.stack(rows), count

    return embed


def cosines(a, b) -> np.ndarray:
    """Row by row."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
