"""The checkpoint's multi-token-prediction layers as one module beside the mlx-lm model (which drops them).

    heads = load_heads(model, folder)             # ModelError with one sentence when the checkpoint has none
    x, logits = heads(hidden, tokens, cache, depth)

`hidden` is the main model's hidden after its final norm (mlx-lm's `model.model(...)`, as vLLM hands it over),
`tokens` the token one position later. Each family's layers come from its module (engine/mtp/files.py NAMING):
"nextn" (engine/mtp/nextn.py), "mtp" (engine/mtp/qwen.py). Chained depth j runs layer j % depths, on cache[j % depths] (vLLM's
spec_step_idx % num_mtp_layers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engine.model import ModelError
from engine.mtp import nextn, qwen
from engine.mtp.files import NAMING, Checkpoint

KINDS = {"nextn": nextn, "mtp": qwen}


class _Main:
    """The main model, held outside the module tree so that Heads' parameters are its own only."""

    def __init__(self, model: Any) -> None:
        self.model = model


class Heads(nn.Module):
    def __init__(self, main: Any, family: str, layers: list[nn.Module], embed: nn.Embedding | None) -> None:
        super().__init__()
        self._main = _Main(main)
        self.family = family
        self.depths = len(layers)
        self.layers = layers
        if embed is not None:  # the checkpoint's own copy; else the main model's embedding is shared
            self.embed_tokens = embed

    def make_cache(self) -> list:
        """One cache per MTP layer, the kind the family's attention keeps (a full-attention KVCache)."""
        from mlx_lm.models.cache import KVCache

        return [KVCache() for _ in range(self.depths)]

    def __call__(self, hidden: mx.array, tokens: mx.array, cache: list | None = None,
                 depth: int = 0) -> tuple[mx.array, mx.array]:
        from mlx_lm.models.base import create_attention_mask

        index = depth % self.depths
        layer = self.layers[index]
        c = cache[index] if cache is not None else None
        e = self._embed(tokens)
        # vLLM zeroes the token's embedding at position 0 (no hidden precedes it): a zero hidden there as well
        # makes the whole input zero
        offset = c.offset if c is not None else 0
        position = mx.reshape(mx.array(offset), (-1, 1)) + mx.arange(tokens.shape[1])
        e = mx.where((position == 0)[..., None], mx.zeros_like(e), e)
        mask = create_attention_mask(e, c, return_array=self.family in nextn.ARRAY_MASK)
        x = layer(e, hidden.astype(e.dtype), mask, c)
        return x, layer.logits(x, lambda y: main_logits(self._main.model, y))

    def _embed(self, tokens: mx.array) -> mx.array:
        if "embed_tokens" in self:
            return self.embed_tokens(tokens)
        return self._main.model.model.embed_tokens(tokens)

    def shard(self, group: Any = None) -> None:
        """Tensor parallel exactly as the main layers: the family's own shard() run over the MTP blocks; the
        projections, norms and heads stay whole on every rank, as the main model's embedding does."""
        KINDS[NAMING[self.family]].shard(self._main.model, self.layers, group)


def main_logits(main: Any, h: mx.array) -> mx.array:
    """The main model's logits from its post-norm hidden, as its own __call__ computes them: a vision-language
    wrapper's language model, tied embeddings, Qwen3.5's lm_head split over ranks gathered back."""
    from mlx_lm.models.base import gather_last_axis

    lm = qwen.text_model(main)
    if not hasattr(lm, "lm_head"):
        return lm.model.embed_tokens.as_linear(h)
    out = lm.lm_head(h)
    if getattr(lm, "sharding_group", None) is not None:
        out = gather_last_axis(out, lm.sharding_group)
    return out


def load_heads(model: Any, folder: Path) -> Heads:
    """The MTP layers the family's sanitize() dropped, read from the folder's safetensors (only the files that
    hold them) into a Heads beside `model`; ModelError with one sentence when the checkpoint ships none."""
    checkpoint = Checkpoint(Path(folder))
    family = type(model).__module__.rsplit(".", 1)[-1]  # mlx-lm's module, after its own remapping
    checkpoint.family = family
    if problem := checkpoint.refusal():
        raise ModelError(problem)
    names = checkpoint.head_names()
    if NAMING[family] == "mtp":  # the main model's final norm too: did mlx-lm shift the norms at load
        names |= {n: f for n, f in checkpoint.names.items() if n in qwen.FINAL_NORM}
    weights: dict[str, mx.array] = {}
    for file in sorted(set(names.values())):
        weights.update({k: v for k, v in mx.load(str(checkpoint.folder / file)).items() if k in names})
    if NAMING[family] == "mtp":
        norms = {n: weights.pop(n) for n in qwen.FINAL_NORM if n in weights}
        return build_heads(model, checkpoint.config, weights, checkpoint.layers, qwen.zero_centred(model, norms))
    return build_heads(model, checkpoint.config, weights, checkpoint.layers)


def build_heads(model: Any, config: dict, weights: dict[str, mx.array], layers: int,
                zero_centred: bool = False) -> Heads:
    """Heads from the checkpoint's MTP tensors (named as in the checkpoint) of a model of `layers` main layers;
    `zero_centred`: the checkpoint stores Qwen's RMSNorm scales as 1 + w (engine/mtp/qwen.py)."""
    family = type(model).__module__.rsplit(".", 1)[-1]
    if NAMING[family] == "mtp":
        pairs = qwen.layers(model, weights, zero_centred)
    else:
        pairs = nextn.layers(model, weights, layers)
    built, embed = [], None
    for layer, own in pairs:
        if embed is None and "embed_tokens.weight" in own:  # vLLM loads the first layer's copy only
            embed = nn.Embedding(*own["embed_tokens.weight"].shape)
            _load(embed, {"weight": own["embed_tokens.weight"]}, config)
        _load(layer, {k: v for k, v in own.items() if not k.startswith("embed_tokens.")}, config)
        built.append(layer)
    heads = Heads(model, family, built, embed)
    heads.eval()  # as mlx-lm leaves the main model
    return heads


def _load(module: nn.Module, weights: dict[str, mx.array], config: dict) -> None:
    """Load strictly, quantizing first the layers the checkpoint stores quantized (as mlx-lm's load_model does)."""
    quantization = config.get("quantization")
    if quantization:
        nn.quantize(module, group_size=quantization["group_size"], bits=quantization["bits"],
                    class_predicate=lambda path, _: f"{path}.scales" in weights)
    module.load_weights(list(weights.items()), strict=True)
    mx.eval(module.parameters())
