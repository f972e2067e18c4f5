"""Plain numpy encoders for the helper tests: Hugging Face's BertModel and ModernBertModel for one unpadded sequence,
in float64, from a checkpoint's tensors as safetensors.numpy reads them (no MLX, nothing of engine/helpers)."""

from __future__ import annotations

import math

import numpy as np

ERF = np.vectorize(math.erf)


def _gelu(x):
    return 0.5 * x * (1.0 + ERF(x / math.sqrt(2.0)))


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * w + b


def bert(w: dict, cfg: dict, ids: list[int], types: list[int], prefix: str = "", first_position: int = 0) -> np.ndarray:
    """Hugging Face's BertModel for one sequence, in float64: embeddings, then post-LN layers. RobertaModel is the
    same with positions counted from padding_idx + 1 (`first_position`)."""
    p = lambda name: w[prefix + name].astype(np.float64)  # noqa: E731
    eps, heads = cfg["layer_norm_eps"], cfg["num_attention_heads"]
    positions = p("embeddings.position_embeddings.weight")[first_position:first_position + len(ids)]
    x = p("embeddings.word_embeddings.weight")[ids] + positions
    x = layer_norm(x + p("embeddings.token_type_embeddings.weight")[types],
                   p("embeddings.LayerNorm.weight"), p("embeddings.LayerNorm.bias"), eps)
    for i in range(cfg["num_hidden_layers"]):
        lin = lambda name, v: v @ p(f"encoder.layer.{i}.{name}.weight").T + p(f"encoder.layer.{i}.{name}.bias")  # noqa: E731
        q, k, v = (lin(f"attention.self.{n}", x).reshape(len(ids), heads, -1).transpose(1, 0, 2)
                   for n in ("query", "key", "value"))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
        s = np.exp(s - s.max(-1, keepdims=True))
        ctx = ((s / s.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(len(ids), -1)
        ln = lambda name, v: layer_norm(v, p(f"encoder.layer.{i}.{name}.LayerNorm.weight"),  # noqa: E731
                                        p(f"encoder.layer.{i}.{name}.LayerNorm.bias"), eps)
        x = ln("attention.output", lin("attention.output.dense", ctx) + x)
        h = lin("intermediate.dense", x)
        x = ln("output", lin("output.dense", _gelu(h)) + x)
    return x


def pool(hidden: np.ndarray, mode: str) -> np.ndarray:
    return {"cls": hidden[0], "mean": hidden.mean(0), "max": hidden.max(0), "lasttoken": hidden[-1],
            "mean_sqrt_len": hidden.sum(0) / math.sqrt(len(hidden))}[mode]


def _rope(x, theta):
    """Rotate-half RoPE over [heads, L, d] at positions 0..L-1."""
    d = x.shape[-1]
    freqs = np.arange(x.shape[1])[:, None] * (1.0 / theta ** (np.arange(0, d, 2) / d))[None, :]
    cos, sin = np.cos(np.concatenate([freqs, freqs], -1)), np.sin(np.concatenate([freqs, freqs], -1))
    return x * cos + np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1) * sin


def modernbert(w: dict, cfg: dict, ids: list[int], prefix: str = "") -> np.ndarray:
    """Hugging Face's ModernBertModel for one sequence: normed embeddings, pre-LN layers (layer 0 without
    attn_norm), global attention every global_attn_every_n_layers-th layer, local (|i - j| <= local_attention // 2)
    otherwise, each with its RoPE theta; GeGLU MLPs; a final norm. No biases (the zoo's config has none)."""
    p = lambda name: w[prefix + name].astype(np.float64)  # noqa: E731
    ln = lambda v, name: layer_norm(v, p(name), 0.0, cfg["norm_eps"])  # noqa: E731
    n, heads = len(ids), cfg["num_attention_heads"]
    x = ln(p("embeddings.tok_embeddings.weight")[ids], "embeddings.norm.weight")
    distance = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
    for i in range(cfg["num_hidden_layers"]):
        local = i % cfg["global_attn_every_n_layers"] != 0
        theta = cfg["local_rope_theta"] if local else cfg["global_rope_theta"]
        y = x if i == 0 else ln(x, f"layers.{i}.attn_norm.weight")
        q, k, v = (y @ p(f"layers.{i}.attn.Wqkv.weight").T).reshape(n, 3, heads, -1).transpose(1, 2, 0, 3)
        q, k = _rope(q, theta), _rope(k, theta)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
        if local:
            s = np.where(distance <= cfg["local_attention"] // 2, s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        ctx = ((s / s.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(n, -1)
        x = x + ctx @ p(f"layers.{i}.attn.Wo.weight").T
        a, g = np.split(ln(x, f"layers.{i}.mlp_norm.weight") @ p(f"layers.{i}.mlp.Wi.weight").T, 2, axis=-1)
        x = x + (_gelu(a) * g) @ p(f"layers.{i}.mlp.Wo.weight").T
    return ln(x, "final_norm.weight")
