"""Qwen3-Next- and Qwen3.5-style MTP layers: mtp.* of the checkpoint.

Follows vLLM's qwen3_next_mtp.py and qwen3_5_mtp.py: e = pre_fc_norm_embedding(embed(token)) (the main model's
embedding), g = pre_fc_norm_hidden(h), x = fc([e, g]), x = norm(layers[j](x)) (layers[j]: a full-attention decoder
layer of the family, its own KV cache); logits = the main lm_head(x), and x (after norm, as vLLM's forward returns
it) is the hidden the next chained depth takes. A sequence's first entry, which no hidden precedes, is all zeros
as for every family (engine/mtp/heads.py).

Hugging Face stores these RMSNorms zero-centred (scale 1 + w, vLLM's Qwen3NextRMSNorm) where mlx-lm's sanitize
adds 1.0 to the main model's: the heads' get the same shift exactly where the main model's got it (`zero_centred`),
so raw checkpoints and conversions that shifted every norm both load right (a raw heads file copied beside an
already converted model would not: its norms would stay unshifted).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import mlx.core as mx
import mlx.nn as nn

# the parts of an MTP layer that are not its decoder block
OWN_PARTS = ("fc", "norm", "pre_fc_norm_embedding", "pre_fc_norm_hidden")
# where checkpoints keep the main model's final norm: Qwen3-Next; Qwen3.5 as Hugging Face and mlx-lm name it
FINAL_NORM = ("model.norm.weight", "model.language_model.norm.weight", "language_model.model.norm.weight")


def text_model(main: Any) -> Any:
    """The language model of a vision-language wrapper (mlx-lm's qwen3_5 Model holds it as language_model)."""
    return getattr(main, "language_model", main)


class MtpLayer(nn.Module):
    """One MTP depth: the checkpoint's mtp.layers.<j> with mtp.fc and the norms around it, the block built from the
    family's own decoder-layer class as a full-attention layer (index full_attention_interval - 1)."""

    def __init__(self, main: Any) -> None:
        super().__init__()
        args = text_model(main).args
        dims, eps = args.hidden_size, args.rms_norm_eps
        self.pre_fc_norm_embedding = nn.RMSNorm(dims, eps=eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(dims, eps=eps)
        self.fc = nn.Linear(2 * dims, dims, bias=False)
        # main.layers: the layers this rank holds (a pipeline stage has None for the others')
        self.mtp_block = type(main.layers[0])(args, args.full_attention_interval - 1)
        self.norm = nn.RMSNorm(dims, eps=eps)

    def __call__(self, e: mx.array, h: mx.array, mask: Any, cache: Any) -> mx.array:
        x = self.fc(mx.concatenate([self.pre_fc_norm_embedding(e), self.pre_fc_norm_hidden(h)], axis=-1))
        return self.norm(self.mtp_block(x, mask, cache))

    def logits(self, x: mx.array, lm_head: Any) -> mx.array:
        return lm_head(x)


def layers(main: Any, weights: dict[str, mx.array], zero_centred: bool) -> list[tuple[MtpLayer, dict]]:
    """Each depth's layer with its tensors named as its parameters: the block's through the family's own sanitize
    (experts stacked into switch_mlp) under a main layer's name, so that they load exactly as a main layer's do;
    every RMSNorm scale shifted by 1.0 where `zero_centred` (kept apart from sanitize, which shifts or not by what
    else the dict holds)."""
    out = []
    for depth in sorted({int(name.split(".")[2]) for name in weights if name.startswith("mtp.layers.")}):
        own, block, norms = {}, {}, {}
        for name, value in weights.items():
            rest = name.removeprefix("mtp.")
            if rest.startswith(f"layers.{depth}."):
                inner = rest.removeprefix(f"layers.{depth}.")
                if _norm(inner, value):
                    norms[f"mtp_block.{inner}"] = value
                else:
                    block[inner] = value
            elif rest.split(".")[0] in OWN_PARTS:  # one fc and norms for every depth (vLLM): each layer a copy
                (norms if _norm(rest, value) else own)[rest] = value
        own.update(_block(main, block))
        own.update({k: v + 1.0 if zero_centred else v for k, v in norms.items()})
        out.append((MtpLayer(main), own))
    return out


def _norm(name: str, value: mx.array) -> bool:
    """An RMSNorm's scale (norm, pre_fc_norm_*, the block's layernorms and q/k norms)."""
    return value.ndim == 1 and name.endswith(".weight") and "norm" in name.rsplit(".", 2)[-2]


def _block(main: Any, block: dict[str, mx.array]) -> dict[str, mx.array]:
    """The block's tensors through the family's sanitize under main layer 0's name (slot 0: below
    num_hidden_layers, the fused-expert split of qwen3_5_moe included), back under mtp_block. Experts stored one
    by one are stacked first: qwen3_5_moe's sanitize stacks only fused ones, and vLLM's qwen3_5_mtp.py reads both."""
    # Hugging Face's names for a Qwen3.5 language model; mlx-lm's qwen3_next reads model.layers
    prefix = "model.language_model.layers.0." if hasattr(main, "language_model") else "model.layers.0."
    sanitized = main.sanitize({prefix + k: v for k, v in _stacked(block).items()})
    return {f"mtp_block.{k.split('layers.0.', 1)[1]}": v for k, v in sanitized.items()}


def _stacked(block: dict[str, mx.array]) -> dict[str, mx.array]:
    """mlp.experts.<e>.<proj>.<param> tensors as mlp.switch_mlp.<proj>.<param>, stacked in expert order."""
    out, experts = {}, {}
    for name, value in block.items():
        parts = name.split(".")
        if len(parts) > 3 and parts[1] == "experts" and parts[2].isdigit():
            experts.setdefault(".".join([parts[0], "switch_mlp", *parts[3:]]), {})[int(parts[2])] = value
        else:
            out[name] = value
    return out | {k: mx.stack([v[e] for e in sorted(v)]) for k, v in experts.items()}


def zero_centred(main: Any, stored: dict[str, mx.array]) -> bool:
    """Whether mlx-lm's sanitize shifted the main model's norms at load (a raw Hugging Face checkpoint): its final
    norm as loaded against the same tensor in the checkpoint (`stored`: the FINAL_NORM tensors found)."""
    for name in FINAL_NORM:
        if name in stored:
            loaded = main.model.norm.weight.astype(mx.float32)
            return bool(mx.abs(loaded - stored[name].astype(mx.float32)).mean() > 0.5)
    return False


def shard(main: Any, built: list[nn.Module], group: Any) -> None:
    """Tensor parallel exactly as the main layers: the family's shard() over the MTP blocks (Qwen3.5's; mlx-lm's
    qwen3_next has none and runs pipelined, its heads whole on the last stage); the vocabulary stays with the main
    lm_head, so the stand-in reports tied embeddings and shard() leaves the head alone."""
    holder = SimpleNamespace(language_model=SimpleNamespace(args=SimpleNamespace(tie_word_embeddings=True)),
                             layers=[layer.mtp_block for layer in built])
    type(main).shard(holder, group)
