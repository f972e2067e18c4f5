"""DeepSeek-V3- and GLM-4.x-MoE-style MTP layers: model.layers.<num_hidden_layers + j>.* of the checkpoint.

Follows vLLM's deepseek_mtp.py and glm4_moe_mtp.py: e = enorm(embed(token)), g = hnorm(h), x = eh_proj([e, g]),
x = mtp_block(x) (a full decoder layer of the family: its attention, its MoE, its own KV cache), logits =
shared_head.head(shared_head.norm(x)); x is what the next chained depth takes as its hidden.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engine.mtp.files import nextn_depth

# the parts of an MTP layer that are not its decoder block (vLLM's _rewrite_spec_layer_name)
OWN_PARTS = ("embed_tokens", "enorm", "hnorm", "eh_proj", "shared_head")
# families whose attention wants the mask as an array (MLA masks its RoPE scores with mx.where)
ARRAY_MASK = {"deepseek_v3"}


class SharedHead(nn.Module):
    def __init__(self, dims: int, vocab: int, eps: float, head: bool) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(dims, eps=eps)
        if head:
            self.head = nn.Linear(dims, vocab, bias=False)


class NextnLayer(nn.Module):
    """One MTP depth: the checkpoint's model.layers.<num_hidden_layers + j>, its block built from the family's own
    decoder-layer class and config so that attention and MoE match the main model's layers."""

    def __init__(self, main: Any, index: int, head: bool) -> None:
        super().__init__()
        args = main.args
        dims, eps = args.hidden_size, args.rms_norm_eps
        self.enorm = nn.RMSNorm(dims, eps=eps)
        self.hnorm = nn.RMSNorm(dims, eps=eps)
        self.eh_proj = nn.Linear(2 * dims, dims, bias=False)
        self.shared_head = SharedHead(dims, args.vocab_size, eps, head)
        # main.layers: the layers this rank holds (a pipeline stage has None for the others')
        self.mtp_block = type(main.layers[0])(args, index)

    def __call__(self, e: mx.array, h: mx.array, mask: Any, cache: Any) -> mx.array:
        x = self.eh_proj(mx.concatenate([self.enorm(e), self.hnorm(h)], axis=-1))
        return self.mtp_block(x, mask, cache)

    def logits(self, x: mx.array, lm_head: Any) -> mx.array:
        """shared_head.head where the checkpoint ships one (DeepSeek-V3), else the main model's lm_head."""
        head = self.shared_head.head if "head" in self.shared_head else lm_head
        return head(self.shared_head.norm(x))


def layers(main: Any, weights: dict[str, mx.array], n_layers: int) -> list[tuple[NextnLayer, dict]]:
    """Each depth's layer with its tensors named as its parameters (a model of `n_layers` main layers)."""
    out = []
    for depth in sorted({nextn_depth(name, n_layers) for name in weights}):
        own = layer_weights(main, weights, n_layers, depth)
        out.append((NextnLayer(main, n_layers + depth, head="shared_head.head.weight" in own), own))
    return out


def shard(main: Any, built: list[nn.Module], group: Any) -> None:
    """The family's own shard() run over the MTP blocks, as over main layers."""
    blocks = SimpleNamespace(model=SimpleNamespace(layers=[layer.mtp_block for layer in built]))
    type(main).shard(blocks, group)


def layer_weights(main: Any, weights: dict[str, mx.array], layers: int, depth: int) -> dict[str, mx.array]:
    """The checkpoint's tensors of MTP depth `depth`, named as NextnLayer's parameters: the block's go through the
    family's own sanitize() (experts stacked into switch_mlp, DeepSeek's kv_b_proj split, fp8 dequantized) under
    a main layer's name, so that they load exactly as a main layer's do."""
    prefix = f"model.layers.{layers + depth}."
    own, block = {}, {}
    for name, value in weights.items():
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix):]
        if rest.split(".")[0] in OWN_PARTS:
            own[rest] = value
        else:
            block[f"model.layers.0.{rest}"] = value  # slot 0: below num_hidden_layers, never a dropped name
    block = main.sanitize(block)
    own.update({f"mtp_block.{k.removeprefix('model.layers.0.')}": v for k, v in block.items()})
    return own
