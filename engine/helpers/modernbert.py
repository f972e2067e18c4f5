"""A ModernBERT encoder in MLX, parameter for parameter as Hugging Face's ModernBertModel names them: normed token
embeddings, pre-LN layers (the first without attn_norm) whose attention is global (RoPE at global_rope_theta) every
global_attn_every_n_layers-th layer and otherwise local (|i - j| <= local_attention / 2, RoPE at local_rope_theta),
GeGLU MLPs, a final norm; and ModernBertForSequenceClassification's head. Used like engine/helpers/bert.py."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from engine.helpers.bert import ACTIVATIONS, checked_activation, fill, read_weights
from engine.load_errors import ModelError

PREFIX = "model."  # ModernBertFor* checkpoints; a sentence-transformers folder holds the bare ModernBertModel


def layer_plan(c: dict) -> list[tuple[bool, float]]:
    """(local?, RoPE theta) per layer, from the config's newer keys (layer_types, rope_parameters) or older ones."""
    every = c.get("global_attn_every_n_layers", 3)
    types = c.get("layer_types") or ["sliding_attention" if i % every else "full_attention"
                                     for i in range(c["num_hidden_layers"])]
    rope = c.get("rope_parameters") or {}
    theta = {"full_attention": (rope.get("full_attention") or {}).get("rope_theta", c.get("global_rope_theta", 160000.0)),
             "sliding_attention": (rope.get("sliding_attention") or {}).get("rope_theta",
                                                                            c.get("local_rope_theta", 10000.0))}
    return [(t == "sliding_attention", float(theta[t])) for t in types]


def _norm(c: dict) -> nn.LayerNorm:
    return nn.LayerNorm(c["hidden_size"], eps=c.get("norm_eps", 1e-5), bias=c.get("norm_bias", False))


class _Attention(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        bias = c.get("attention_bias", False)
        self.Wqkv = nn.Linear(c["hidden_size"], 3 * c["hidden_size"], bias=bias)
        self.Wo = nn.Linear(c["hidden_size"], c["hidden_size"], bias=bias)


class _MLP(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        bias = c.get("mlp_bias", False)
        self.Wi = nn.Linear(c["hidden_size"], 2 * c["intermediate_size"], bias=bias)
        self.Wo = nn.Linear(c["intermediate_size"], c["hidden_size"], bias=bias)


class _Layer(nn.Module):
    def __init__(self, c: dict, first: bool, local: bool, theta: float):
        super().__init__()
        if not first:  # layer 0 takes the embeddings' norm as its own (attn_norm is Identity there)
            self.attn_norm = _norm(c)
        self.attn = _Attention(c)
        self.mlp_norm = _norm(c)
        self.mlp = _MLP(c)
        self.heads, self.local, self.theta = c["num_attention_heads"], local, theta
        self.act = ACTIVATIONS[c.get("hidden_activation", "gelu")]

    def __call__(self, x: mx.array, keep: dict[bool, mx.array]) -> mx.array:
        b, n, h = x.shape
        y = self.attn_norm(x) if "attn_norm" in self else x
        qkv = self.attn.Wqkv(y).reshape(b, n, 3, self.heads, -1).transpose(2, 0, 3, 1, 4)
        d = qkv.shape[-1]
        q, k = (mx.fast.rope(t, d, traditional=False, base=self.theta, scale=1.0, offset=0) for t in (qkv[0], qkv[1]))
        ctx = mx.fast.scaled_dot_product_attention(q, k, qkv[2], scale=d ** -0.5, mask=keep[self.local])
        x = x + self.attn.Wo(ctx.transpose(0, 2, 1, 3).reshape(b, n, h))
        gate_in, gate = mx.split(self.mlp.Wi(self.mlp_norm(x)), 2, axis=-1)
        return x + self.mlp.Wo(self.act(gate_in) * gate)


class _Embeddings(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.tok_embeddings = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.norm = _norm(c)


class _Head(nn.Module):
    """ModernBertPredictionHead: norm(act(dense(pooled)))."""

    def __init__(self, c: dict):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["hidden_size"], bias=c.get("classifier_bias", False))
        self.norm = _norm(c)


class ModernBert(nn.Module):
    def __init__(self, c: dict, labels: int = 0):
        super().__init__()
        self.embeddings = _Embeddings(c)
        self.layers = [_Layer(c, i == 0, local, theta) for i, (local, theta) in enumerate(layer_plan(c))]
        self.final_norm = _norm(c)
        self.window = c.get("local_attention", 128) // 2
        if labels:
            self.head = _Head(c)
            self.classifier = nn.Linear(c["hidden_size"], labels)
            self.pooling = c.get("classifier_pooling", "cls")
            self.classifier_act = ACTIVATIONS[c.get("classifier_activation", "gelu")]

    def __call__(self, ids: mx.array, types: mx.array, lengths: mx.array) -> mx.array:
        """Last hidden states [n, L, hidden] of right-padded `ids` (no token types in ModernBERT)."""
        pos = mx.arange(ids.shape[1])
        real = (pos[None, :] < lengths[:, None])[:, None, None, :]
        near = mx.abs(pos[:, None] - pos[None, :]) <= self.window
        keep = {False: real, True: real & near[None, None]}
        x = self.embeddings.norm(self.embeddings.tok_embeddings(ids))
        for layer in self.layers:
            x = layer(x, keep)
        return self.final_norm(x)

    def classify(self, hidden: mx.array, lengths: mx.array) -> mx.array:
        if self.pooling == "mean":
            keep = (mx.arange(hidden.shape[1])[None, :] < lengths[:, None])[..., None]
            pooled = (hidden * keep).sum(axis=1) / lengths[:, None].astype(hidden.dtype)
        else:
            pooled = hidden[:, 0]
        return self.classifier(self.head.norm(self.classifier_act(self.head.dense(pooled))))


def load_modernbert(folder: Path, config: dict, labels: int = 0) -> ModernBert:
    checked_activation(folder, config, "hidden_activation")
    if labels:
        checked_activation(folder, config, "classifier_activation")
    rope = config.get("rope_parameters") or {}
    odd = {p.get("rope_type") for p in rope.values() if isinstance(p, dict)} - {None, "default"}
    if odd or config.get("rope_scaling"):
        raise ModelError(f"{folder / 'config.json'} scales RoPE ({', '.join(map(str, odd)) or 'rope_scaling'}), which "
                         "this ModernBERT lacks; serve a model with plain RoPE")
    return fill(ModernBert(config, labels), read_weights(folder, PREFIX), folder, config)
