"""Every rank: DeepStack (Qwen3-VL) on mlx-lm's text model: the tower's intermediate features of an image are added
to the hidden states its tokens leave the first decoder layers with, one layer per feature level, as mlx-vlm's
Qwen3-VL language model adds them. The rows travel with the image's input rows (engine/vision/table.py splits them)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx

_subclasses: dict[type, type] = {}


def install(model: Any, table, levels: int) -> None:
    """Make the first `levels` decoder layers add the DeepStack rows of the forward pass running now."""
    layers = model.layers if hasattr(model, "layers") else model.language_model.model.layers
    for level, layer in enumerate(layers[:levels]):
        base = type(layer)
        if base not in _subclasses:
            _subclasses[base] = type(f"DeepStack{base.__name__}", (base,), {"__call__": _call_adding_features})
        layer.__class__ = _subclasses[base]
        object.__setattr__(layer, "_deepstack", (table, level))


def _call_adding_features(self, x: mx.array, *args, **kwargs) -> mx.array:
    table, level = object.__getattribute__(self, "_deepstack")
    h = type(self).__mro__[1].__call__(self, x, *args, **kwargs)
    if table.deep is None:
        return h
    where, rows = table.deep
    flat = h.reshape(-1, h.shape[-1])
    flat[where] = flat[where] + rows[:, level].astype(h.dtype)
    return flat.reshape(h.shape)
