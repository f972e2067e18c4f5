"""Tensor parallelism for mlx-lm's gemma3_text (Gemma 3's language model, alone or inside the gemma3
vision-language wrapper), which has no shard().

mlx-lm's llama recipe on Gemma 3's classes: q/k/v split by heads and o_proj summed over the ranks, the MLP's
gate/up split and down_proj summed. q_norm and k_norm act within one head (head_dim wide), so every rank keeps
them whole; the embedding and its tied output stay whole too, which the image features' rows need
(engine/vision/table.py). Gemma 3's vision checkpoints have 8 to 32 query and 4 to 16 KV heads.
"""

from __future__ import annotations

from typing import Any


def shard(self, group: Any = None) -> None:
    import mlx.core as mx
    from mlx.nn.layers.distributed import shard_linear

    group = group or mx.distributed.init()
    n = group.size()
    for layer in self.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.q_proj = shard_linear(attn.q_proj, "all-to-sharded", group=group)
        attn.k_proj = shard_linear(attn.k_proj, "all-to-sharded", group=group)
        attn.v_proj = shard_linear(attn.v_proj, "all-to-sharded", group=group)
        attn.o_proj = shard_linear(attn.o_proj, "sharded-to-all", group=group)
        attn.n_heads //= n
        attn.n_kv_heads //= n  # attn.repeats (query heads per KV head) is unchanged
        mlp.gate_proj = shard_linear(mlp.gate_proj, "all-to-sharded", group=group)
        mlp.up_proj = shard_linear(mlp.up_proj, "all-to-sharded", group=group)
        mlp.down_proj = shard_linear(mlp.down_proj, "sharded-to-all", group=group)


def install() -> None:
    """Give mlx-lm's gemma3_text Model this shard() (before a model is built or asked what it can do)."""
    from mlx_lm.models import gemma3_text

    if "shard" not in gemma3_text.Model.__dict__:
        gemma3_text.Model.shard = shard
