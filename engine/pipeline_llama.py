"""Pipeline parallelism for mlx-lm's llama, which has shard() but no pipeline().

Llama-shaped checkpoints (SmolLM2, Llama 3, Mistral mapped onto llama) often have head counts the ranks
cannot divide (9 heads on 2 ranks, 8 KV heads on 3), so pipeline is their only way onto several ranks. This
is mlx-lm's own recipe (PipelineMixin and the receive / run my layers / send / all_gather of its qwen2
model) on llama's classes: same parameter names, same weights, same cache kinds.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.pipeline import PipelineMixin


class PipelinedLlamaModel(llama.LlamaModel, PipelineMixin):
    """llama's decoder stack, each rank running only its own layers."""

    def __init__(self, args: llama.ModelArgs):
        super().__init__(args)
        # in this order the mixin's __init__ is never reached (nn.Module's ends the chain): one stage until pipeline()
        self.pipeline_rank, self.pipeline_size, self.start_idx, self.end_idx = 0, 1, 0, None

    def __call__(self, inputs: mx.array, cache=None, input_embeddings: mx.array | None = None) -> mx.array:
        h = input_embeddings if input_embeddings is not None else self.embed_tokens(inputs)
        rank, size = self.pipeline_rank, self.pipeline_size
        layers = self.pipeline_layers
        if cache is None:
            cache = [None] * len(layers)
        # the masks come from this rank's own first layer of each kind (llama's indices count every layer)
        full = next((i for i, layer in enumerate(layers) if not layer.use_sliding), None)
        window = next((i for i, layer in enumerate(layers) if layer.use_sliding), None)
        full_mask = create_attention_mask(h, cache[full]) if full is not None else None
        window_mask = (create_attention_mask(h, cache[window], window_size=self.sliding_window)
                       if window is not None else None)
        if rank < size - 1:  # the ranks after this one hold the earlier layers
            h = mx.distributed.recv(h.shape, _after_layers(layers[0], h), rank + 1)
        for layer, c in zip(layers, cache):
            h = layer(h, window_mask if layer.use_sliding else full_mask, cache=c)
        if rank != 0:
            h = mx.distributed.send(h, rank - 1)
            if cache[-1] is not None:
                cache[-1].keys = mx.depends(cache[-1].keys, h)
        if size > 1:  # every rank gets rank 0's output, keeping the send in the graph
            h = mx.distributed.all_gather(h)[: h.shape[0]]
        return self.norm(h)


def _after_layers(layer: nn.Module, h: mx.array) -> mx.Dtype:
    """The dtype h has after the earlier ranks' layers, which may differ from the embedding's (a GGUF's float32
    norms around float16 scales promote it): one of this rank's own layers, built lazily and never run, tells."""
    return layer(h, None).dtype


class Model(llama.Model):
    """mlx-lm's llama Model with the pipelined stack; make_cache and the KV measure see this rank's layers."""

    def __init__(self, args: llama.ModelArgs):
        super().__init__(args)
        self.model = PipelinedLlamaModel(args)

    @property
    def layers(self):
        return self.model.pipeline_layers


_wrappers: dict[type, type] = {}


def pipelined_wrapper(base: type) -> type:
    """A vision-language wrapper (mistral3: its text model in .language_model) that pipelines: its llama text model
    swapped for the pipelined one, and the stack (.model) and this rank's layers seen through it, as a text
    model's are. Its vision tower is not in mlx-lm's classes: rank 0 holds it (engine/vision)."""
    if base not in _wrappers:
        def __init__(self, args: Any) -> None:
            base.__init__(self, args)
            if type(self.language_model) is llama.Model:
                self.language_model = Model(self.language_model.args)

        _wrappers[base] = type(f"Pipelined{base.__name__}", (base,), {
            "__init__": __init__,
            "model": property(lambda self: self.language_model.model),
            "layers": property(lambda self: self.language_model.layers)})
    return _wrappers[base]


def model_classes(config: dict) -> tuple[type, type]:
    """mlx-lm's classes for `config`, with llama's Model swapped for the pipelined one (for load_model), inside a
    vision-language wrapper too."""
    from mlx_lm.utils import _get_classes

    from engine.vision.shard import WRAPPERS

    model, args = _get_classes(config)
    if model is llama.Model:
        return Model, args
    if model.__module__.rsplit(".", 1)[-1] in WRAPPERS and not hasattr(model, "model"):
        return pipelined_wrapper(model), args
    return model, args


def load_model(path: Any, **kwargs: Any) -> tuple[Any, dict]:
    """mlx_lm.utils.load_model with llama pipelined."""
    from mlx_lm.utils import load_model as mlx_load_model

    return mlx_load_model(path, get_model_classes=model_classes, **kwargs)
