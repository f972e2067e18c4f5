"""A BERT-style encoder in MLX, parameter for parameter as Hugging Face's BertModel / RobertaModel name them
(embeddings, post-LayerNorm encoder layers, pooler, sequence-classification heads), read from safetensors.

Used by the embedding family (engine/helpers/families/encoder.py) and the cross-encoder reranker
(engine/helpers/families/rerank.py). No dropout: inference only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from engine.load_errors import ModelError

# model_type -> the prefix its *For* checkpoints put before the encoder's tensors (modernbert: its own module).
ENCODER_TYPES = {"bert": "bert.", "roberta": "roberta.", "xlm-roberta": "roberta.", "modernbert": "model."}
ROBERTA_TYPES = ("roberta", "xlm-roberta")
ACTIVATIONS = {"gelu": nn.gelu, "gelu_new": nn.gelu_approx, "gelu_pytorch_tanh": nn.gelu_approx,
                "relu": nn.relu, "silu": nn.silu, "swish": nn.silu}


def is_encoder(config: dict) -> bool:
    return config.get("model_type") in ENCODER_TYPES


def is_classifier(config: dict) -> bool:
    return any(a.endswith("ForSequenceClassification") for a in config.get("architectures") or ())


def position_offset(config: dict) -> int:
    """RoBERTa counts positions from padding_idx + 1 (its first two rows are never used); BERT from 0."""
    return config.get("pad_token_id", 1) + 1 if config["model_type"] in ROBERTA_TYPES else 0


class _Linear(nn.Module):
    """A block whose only parts are `dense` and a post-LayerNorm, as BertSelfOutput / BertOutput."""

    def __init__(self, n_in: int, n_out: int, eps: float):
        super().__init__()
        self.dense = nn.Linear(n_in, n_out)
        self.LayerNorm = nn.LayerNorm(n_out, eps=eps)


class _SelfAttention(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.query, self.key, self.value = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)


class _Attention(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        setattr(self, "self", _SelfAttention(hidden))  # Hugging Face's name: attention.self.query
        self.output = _Linear(hidden, hidden, eps)


class _Intermediate(nn.Module):
    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.dense = nn.Linear(hidden, inner)


class _Layer(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        hidden, eps = c["hidden_size"], c.get("layer_norm_eps", 1e-12)
        self.heads = c["num_attention_heads"]
        self.attention = _Attention(hidden, eps)
        self.intermediate = _Intermediate(hidden, c["intermediate_size"])
        self.output = _Linear(c["intermediate_size"], hidden, eps)
        self.act = ACTIVATIONS[c.get("hidden_act", "gelu")]

    def __call__(self, x: mx.array, keep: mx.array) -> mx.array:
        b, n, h = x.shape
        attn = self.attention["self"]

        def heads(t):
            return t.reshape(b, n, self.heads, -1).transpose(0, 2, 1, 3)

        q, k, v = heads(attn.query(x)), heads(attn.key(x)), heads(attn.value(x))
        ctx = mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(h // self.heads), mask=keep)
        ctx = ctx.transpose(0, 2, 1, 3).reshape(b, n, h)
        out = self.attention.output
        x = out.LayerNorm(out.dense(ctx) + x)
        y = self.output.dense(self.act(self.intermediate.dense(x)))
        return self.output.LayerNorm(y + x)


class _Encoder(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.layer = [_Layer(c) for _ in range(c["num_hidden_layers"])]


class _Embeddings(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        hidden = c["hidden_size"]
        self.word_embeddings = nn.Embedding(c["vocab_size"], hidden)
        self.position_embeddings = nn.Embedding(c["max_position_embeddings"], hidden)
        self.token_type_embeddings = nn.Embedding(c.get("type_vocab_size", 2), hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=c.get("layer_norm_eps", 1e-12))


class _Pooler(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)


class _RobertaHead(nn.Module):
    """RobertaClassificationHead: dense + tanh on the <s> token, then out_proj (no pooler)."""

    def __init__(self, hidden: int, labels: int):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.out_proj = nn.Linear(hidden, labels)


class Bert(nn.Module):
    """The encoder; with `pooler` and `classifier` where the checkpoint has them."""

    def __init__(self, c: dict, pooler: bool, labels: int = 0):
        super().__init__()
        self.offset = position_offset(c)
        self.embeddings = _Embeddings(c)
        self.encoder = _Encoder(c)
        if pooler:
            self.pooler = _Pooler(c["hidden_size"])
        if labels:
            bert = c["model_type"] == "bert"
            self.classifier = nn.Linear(c["hidden_size"], labels) if bert else _RobertaHead(c["hidden_size"], labels)

    def __call__(self, ids: mx.array, types: mx.array, lengths: mx.array) -> mx.array:
        """Last hidden states [n, L, hidden] of right-padded `ids`; pad positions are masked out as keys."""
        e = self.embeddings
        positions = mx.arange(ids.shape[1]) + self.offset
        x = e.word_embeddings(ids) + e.position_embeddings(positions) + e.token_type_embeddings(types)
        x = e.LayerNorm(x)
        keep = (mx.arange(ids.shape[1])[None, :] < lengths[:, None])[:, None, None, :]
        for layer in self.encoder.layer:
            x = layer(x, keep)
        return x

    def classify(self, hidden: mx.array, lengths: mx.array) -> mx.array:
        """The sequence-classification logits [n, labels] from the first token's hidden state."""
        first = hidden[:, 0]
        if isinstance(self.classifier, nn.Linear):  # BertForSequenceClassification: classifier(pooler_output)
            return self.classifier(mx.tanh(self.pooler.dense(first)))
        head = self.classifier
        return head.out_proj(mx.tanh(head.dense(first)))


def read_config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text(encoding="utf-8"))


def checked_activation(folder: Path, config: dict, key: str) -> None:
    if config.get(key, "gelu") not in ACTIVATIONS:
        raise ModelError(f"{folder / 'config.json'} asks for {key} {config[key]!r}, which this encoder lacks (it has "
                         f"{', '.join(ACTIVATIONS)}); serve another model")


def read_weights(folder: Path, prefix: str) -> dict[str, mx.array]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{folder} has no *.safetensors weights; save the model with safetensors "
                         "(transformers' save_pretrained(safe_serialization=True)) and point the setting at it")
    weights: dict[str, mx.array] = {}
    for f in files:
        for name, value in mx.load(str(f)).items():
            # Older checkpoints name LayerNorm's parameters as TensorFlow did.
            name = name.removeprefix(prefix).replace("LayerNorm.gamma", "LayerNorm.weight")
            weights[name.replace("LayerNorm.beta", "LayerNorm.bias")] = value
    return weights


def fill(model: nn.Module, weights: dict[str, mx.array], folder: Path, config: dict) -> nn.Module:
    """`model` with the folder's tensors; those it has no use for (a masked-LM head, buffers, a classifier when
    embedding) are left out, and any it lacks is an error naming it."""
    from mlx.utils import tree_flatten

    wanted = dict(tree_flatten(model.parameters()))
    missing = sorted(set(wanted) - set(weights))
    if missing:
        raise ModelError(f"the weights in {folder} lack {len(missing)} tensor(s) that the {config['model_type']} model "
                         f"its config.json describes needs ({missing[0]}, ...); restore the files that came with the "
                         "model")
    try:
        model.load_weights([(name, weights[name]) for name in wanted], strict=True)
    except ValueError as exc:
        raise ModelError(f"the weights in {folder} do not fit the {config['model_type']} model its config.json "
                         f"describes ({exc}); restore the files that came with the model") from exc
    mx.eval(model.parameters())
    return model


def load_bert(folder: Path, config: dict, labels: int = 0) -> Bert:
    """The encoder in `folder` with its checkpoint's weights (and its classifier when `labels`)."""
    checked_activation(folder, config, "hidden_act")
    weights = read_weights(folder, ENCODER_TYPES[config["model_type"]])
    # BertForSequenceClassification reads the pooler; an embedder needs it only to load it
    pooler = "pooler.dense.weight" in weights or bool(labels and config["model_type"] == "bert")
    return fill(Bert(config, pooler=pooler, labels=labels), weights, folder, config)


def token_types(ids: mx.array, sep_id: int | None, type_vocab: int) -> mx.array:
    """Segment ids as BERT's tokenizer gives a pair: 0 up to and including the first [SEP], then 1."""
    if sep_id is None or type_vocab < 2:
        return mx.zeros_like(ids)
    seen = mx.cumsum((ids == sep_id).astype(mx.int32), axis=1)
    return ((seen - (ids == sep_id).astype(mx.int32)) > 0).astype(ids.dtype)


def padded(batch: list[list[int]], pad_id: int) -> tuple[mx.array, mx.array]:
    """Right-padded ids [n, longest] and each row's length."""
    longest = max(len(row) for row in batch)
    ids = mx.array([row + [pad_id] * (longest - len(row)) for row in batch], dtype=mx.int32)
    return ids, mx.array([len(row) for row in batch], dtype=mx.int32)


def weight_bytes(model: nn.Module) -> int:
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))
