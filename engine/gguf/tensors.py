"""A llama GGUF's tensors and hyperparameters as mlx-lm's `llama` model names them.

`mx.load` already returns Q4_1 (and Q8_0) blocks as MLX's affine triplets (weight, scales, biases; group 32):
Q4_1 is d*q + m and MLX's dequantisation scale*q + bias, so the blocks pass through unchanged. A file mixes
widths (SmolLM2's Q4_1 keeps its embedding in Q8_0), so each module's bits are read from its packed shape.
"""

from __future__ import annotations

GROUP_SIZE = 32
BITS = 4

_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}


def _int(meta: dict, key: str) -> int:
    return int(meta[key].item())


def bits(weights: dict, module: str) -> int:
    """The width of a quantized module: 32-bit words per row against groups per row."""
    packed, groups = weights[f"{module}.weight"].shape[-1], weights[f"{module}.scales"].shape[-1]
    return packed * 32 // (groups * GROUP_SIZE)


def quantization(weights: dict) -> dict:
    """mlx-lm's `quantization` entry: BITS for all, and each module of another width by its own name."""
    config: dict = {"group_size": GROUP_SIZE, "bits": BITS}
    for name in sorted(weights):
        if name.endswith(".scales") and (b := bits(weights, name[:-len(".scales")])) != BITS:
            config[name[:-len(".scales")]] = {"group_size": GROUP_SIZE, "bits": b}
    return config


def config(meta: dict, weights: dict) -> dict:
    """config.json for mlx-lm's llama from the GGUF's `llama.*` metadata and the renamed tensors."""
    heads = _int(meta, "llama.attention.head_count")
    hidden = _int(meta, "llama.embedding_length")
    eos = _int(meta, "tokenizer.ggml.eos_token_id")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": _int(meta, "llama.block_count"),
        "intermediate_size": _int(meta, "llama.feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": _int(meta, "llama.attention.head_count_kv"),
        "head_dim": hidden // heads,
        "max_position_embeddings": _int(meta, "llama.context_length"),
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "rms_norm_eps": float(f"{meta['llama.attention.layer_norm_rms_epsilon'].item():.7g}"),  # float32 -> 1e-05
        "rope_theta": float(meta["llama.rope.freq_base"].item()),
        # q/k rows are un-permuted below, so the standard (non-traditional) rope of the original checkpoint applies
        "rope_traditional": False,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "bos_token_id": _int(meta, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos,
        "pad_token_id": _int(meta, "tokenizer.ggml.padding_token_id") if "tokenizer.ggml.padding_token_id" in meta
        else eos,
        "torch_dtype": "float16",
        "quantization": quantization(weights),
    }


def unpermute(x, heads: int):
    """Undo llama.cpp's q/k row order (each head's rotary halves interleaved, for its rope): the rows go back to
    the original checkpoint's order, as `convert_hf_to_gguf.py`'s permute() took them. Rows only, so the packed
    weight and its scales and biases move alike."""
    rows = x.shape[0]
    return x.reshape(heads, rows // heads // 2, 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


def rename(name: str) -> str:
    """`blk.3.attn_q.scales` -> `model.layers.3.self_attn.q_proj.scales`."""
    parts = name.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{_LAYER[parts[2]]}.{parts[3]}"
    return f"{_GLOBAL[parts[0]]}.{parts[1]}"


def tensors(weights: dict, meta: dict) -> dict:
    """mlx-lm's llama parameters from the GGUF's tensors; an unknown tensor raises KeyError (not a llama GGUF)."""
    heads = {"attn_q": _int(meta, "llama.attention.head_count"), "attn_k": _int(meta, "llama.attention.head_count_kv")}
    out = {}
    for name, value in weights.items():
        kind = name.split(".")[2] if name.startswith("blk.") else ""
        out[rename(name)] = unpermute(value, heads[kind]) if kind in heads else value
    return out
