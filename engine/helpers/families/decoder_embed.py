"""Decoder embedders (Qwen3-Embedding, gte-Qwen2): mlx-lm's own model class for the config's model_type, its
lm_head unused; the embedding is the final hidden state of the input's last token, L2-normalized.

As the model card tokenizes: the text, then <|endoftext|> (Qwen3-Embedding's tokenizer appends it; where a
folder's tokenizer does not, this family does). Matryoshka: Qwen3-Embedding was trained so that the first k
dimensions, renormalized, are an embedding too (32 up to its width).

Inputs are right-padded into one batch: under a causal mask no real token sees the padding after it, so each
row's last real position holds exactly what the input alone would give.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn

KIND = "embedding"
MODEL_TYPES = ("qwen3", "qwen2")
EOS_TEXT = "<|endoftext|>"
# the checkpoints on the hub carry the bare model (no "model." prefix, no lm_head); mlx conversions may carry both
PREFIX = "model."


def matches(config: dict) -> bool:
    return config.get("model_type") in MODEL_TYPES


def _classes(config: dict):
    arch = importlib.import_module(f"mlx_lm.models.{config['model_type']}")

    class Embedder(nn.Module):
        """The decoder's layers and final norm (mlx-lm's class), without its lm_head."""

        def __init__(self, args: Any):
            super().__init__()
            self.model = arch.Model(args).model

        def sanitize(self, weights: dict) -> dict:
            return {(k if k.startswith(PREFIX) else PREFIX + k): v for k, v in weights.items()
                    if not k.startswith("lm_head.") and "rotary_emb.inv_freq" not in k}

    return Embedder, arch.ModelArgs


class DecoderEmbedder:
    kind: Literal["embedding", "rerank"] = "embedding"
    matryoshka = True

    def __init__(self, model: Any, tokenizer: Any, config: dict, name: str):
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.dimensions = int(config["hidden_size"])
        self.max_tokens = int(config.get("max_position_embeddings") or 32768)
        self.vocab_size = int(config["vocab_size"])  # token ids a client may send (beyond the protocol)
        eos = tokenizer.convert_tokens_to_ids(EOS_TEXT)
        self.eos_id = eos if isinstance(eos, int) and eos != tokenizer.unk_token_id else tokenizer.eos_token_id

    def tokenize(self, text: str) -> list[int]:
        ids = list(self.tokenizer.encode(text, add_special_tokens=True))
        return ids if ids and ids[-1] == self.eos_id else [*ids, self.eos_id]

    def embed(self, batch: list[list[int]]) -> mx.array:
        width = max(len(ids) for ids in batch)
        padded = mx.array([ids + [self.eos_id] * (width - len(ids)) for ids in batch])
        hidden = self.model.model(padded)
        last = mx.array([len(ids) - 1 for ids in batch])
        pooled = mx.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0, :].astype(mx.float32)
        return pooled / mx.maximum(mx.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)

    def pair_tokens(self, query: str, document: str, limit: int | None = None) -> list[int]:
        raise NotImplementedError("an embedding model scores no pairs")

    def score(self, batch: list[list[int]]) -> mx.array:
        raise NotImplementedError("an embedding model scores no pairs")

    def weight_bytes(self) -> int:
        from mlx.utils import tree_flatten

        return sum(v.nbytes for _, v in tree_flatten(self.model.parameters()))


def load(folder: Path, name: str) -> DecoderEmbedder:
    from mlx_lm.utils import load_model, load_tokenizer

    from engine.mlx_compat import hf_tokenizer

    model, config = load_model(folder, lazy=False, strict=True, get_model_classes=_classes)
    model.eval()
    tokenizer = hf_tokenizer(load_tokenizer(folder))
    return DecoderEmbedder(model, tokenizer, config, name)
