"""Embeddings from a BERT-style encoder (BERT, RoBERTa, XLM-RoBERTa, ModernBERT: all-MiniLM, bge, e5, gte,
multilingual-e5, modernbert-embed): the folder's tokenizer adds [CLS]/[SEP] (or <s>/</s>), the encoder runs in MLX
(engine/helpers/bert.py, engine/helpers/modernbert.py),
and the token embeddings are pooled and normalized as its sentence-transformers files say
(engine/helpers/st_folder.py)."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from engine.helpers import bert
from engine.helpers.st_folder import Embedding, max_tokens, read_embedding
from engine.load_errors import ModelError

KIND = "embedding"


def matches(config: dict) -> bool:
    """An encoder without a sequence-classification head (those rerank: engine/helpers/families/rerank.py)."""
    return bert.is_encoder(config) and not bert.is_classifier(config)


def load(folder: Path, name: str) -> EncoderEmbedder:
    config = bert.read_config(folder)
    return EncoderEmbedder(folder, name, config, load_network(folder, config), read_embedding(folder))


def load_network(folder: Path, config: dict, labels: int = 0):
    """The encoder of the config's model_type with the folder's weights (a classifier of `labels` outputs)."""
    if config.get("quantization") or config.get("quantization_config"):
        raise ModelError(f"{folder / 'config.json'} describes quantized weights, which this encoder does not read; "
                         "point the setting at the model's original Hugging Face folder (float weights)")
    if config["model_type"] == "modernbert":
        from engine.helpers.modernbert import load_modernbert

        return load_modernbert(folder, config, labels)
    return bert.load_bert(folder, config, labels)


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def pool(hidden: mx.array, lengths: mx.array, mode: str) -> mx.array:
    """One vector per row of right-padded `hidden` [n, L, d], as sentence-transformers' Pooling computes it."""
    hidden = hidden.astype(mx.float32)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "lasttoken":
        return hidden[mx.arange(hidden.shape[0]), lengths - 1]
    keep = (mx.arange(hidden.shape[1])[None, :] < lengths[:, None])[..., None]
    if mode == "max":
        return mx.where(keep, hidden, -mx.inf).max(axis=1)
    total = (hidden * keep).sum(axis=1)
    count = lengths[:, None].astype(mx.float32)
    return total / (mx.sqrt(count) if mode == "mean_sqrt_len" else count)


def normalized(x: mx.array) -> mx.array:
    """L2-normalized rows (torch.nn.functional.normalize's eps: an all-zero row stays zero)."""
    return x / mx.maximum(mx.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


class EncoderEmbedder:
    """engine.helpers.base.Helper for an encoder's embeddings."""

    kind = "embedding"
    matryoshka = False

    def __init__(self, folder: Path, name: str, config: dict, model: bert.Bert, embedding: Embedding):
        self.name, self.model, self.embedding = name, model, embedding
        self.tokenizer = load_tokenizer(folder)
        self.dimensions = config["hidden_size"]
        self.vocab_size = config["vocab_size"]  # token ids a client may send (beyond the protocol)
        self.max_tokens = max_tokens(config, embedding.max_seq_length, bert.position_offset(config))
        self.pad_id = config.get("pad_token_id") or 0

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=True)

    def embed(self, batch: list[list[int]]) -> mx.array:
        ids, lengths = bert.padded(batch, self.pad_id)
        hidden = self.model(ids, mx.zeros_like(ids), lengths)
        vectors = pool(hidden, lengths, self.embedding.pooling)
        return normalized(vectors) if self.embedding.normalize else vectors

    def pair_tokens(self, query: str, document: str, limit: int | None = None) -> list[int]:
        raise NotImplementedError("an embedding model scores no pairs")

    def score(self, batch: list[list[int]]) -> mx.array:
        raise NotImplementedError("an embedding model scores no pairs")

    def weight_bytes(self) -> int:
        return bert.weight_bytes(self.model)
