"""Linear-attention states after every position of a verify pass, so each row can keep the one after its last kept
token.

A Gated DeltaNet layer (Qwen3.5, Qwen3-Next) keeps two states in its ArraysCache: cache[0], the last (kernel - 1)
inputs of its causal convolution, and cache[1], the delta rule's recurrent state. Both fold in every token and give
back none, so a verify pass over [next input, d1..dk] must leave each state as it stood after every position: the
conv state after position t is a slice of the concatenation (old conv state, the pass's inputs) the layer feeds its
conv1d, and the recurrent state is stepped one token at a time (mlx-lm's Metal kernel returns only the last state;
a verify pass is at most 1 + NUM_DRAFT_TOKENS tokens, and prefill keeps the fast path, as recording is off there).

mlx-lm's layers are used as they are: while `recording` is on, each such layer's conv1d (its class swapped on the
instance for a subclass that notes its input) and the `gated_delta_update` of its module (wrapped once) report to
the recording, which knows each layer's cache by the recurrent state the layer passes in. Every rank does the same
on its own shard of the heads; nothing crosses ranks.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache

from engine.speculative.carry import HiddenCarry

_active: Recording | None = None  # the verify pass in progress (lockstep: one step at a time per process)


class Recording:
    """What one verify pass's linear layers left: per cache, the conv input and the recurrent states (B, W, ...)."""

    def __init__(self, caches: list[ArraysCache]):
        self.by_state = {id(c[1]): c for c in caches if c[1] is not None}
        self.conv: mx.array | None = None  # the last conv1d input, until its layer's recurrence claims it
        self.kept: dict[int, tuple[mx.array, mx.array]] = {}  # id(cache) -> (conv input, states after each position)

    def select(self, cache: ArraysCache, last: mx.array) -> None:
        """Set cache to the states after position last[i] (0-based within the pass) for each row i."""
        conv, states = self.kept[id(cache)]
        n_keep = conv.shape[1] - states.shape[1]
        at = (last + 1)[:, None] + mx.arange(n_keep)  # the conv inputs after position last: n_keep of them
        cache[0] = mx.contiguous(mx.take_along_axis(conv, at[..., None], axis=1))
        cache[1] = mx.take_along_axis(states, last.reshape(-1, *([1] * (states.ndim - 1))), axis=1).squeeze(1)


def supports(model: Any, caches: list) -> bool:
    """Whether every ArraysCache of caches belongs to a layer recording can follow (a conv1d fed the concatenated
    inputs, then its module's gated_delta_update), one such layer per ArraysCache."""
    arrays = _states(caches)
    if not arrays:
        return False  # nothing to record (a model without linear layers need not be an nn.Module)
    layers = _linear_layers(model)
    return len(layers) == len(arrays) and all(
        hasattr(sys.modules.get(type(m).__module__), "gated_delta_update") for m in layers)


@contextmanager
def recording(model: Any, caches: list):
    """Record every linear layer's per-position states during the forward pass run inside (None: no such layer)."""
    global _active
    arrays = _states(caches)
    if not arrays:
        yield None
        return
    _install(model)
    _active = Recording(arrays)
    try:
        yield _active
    finally:
        _active = None


def _states(caches: list) -> list:
    """The linear-attention states among caches (SPECULATIVE=mtp's HiddenCarry is an ArraysCache too, set apart)."""
    return [c for c in caches if isinstance(c, ArraysCache) and not isinstance(c, HiddenCarry)]


def _linear_layers(model: Any) -> list:
    return [m for _, m in model.named_modules() if hasattr(m, "conv1d") and hasattr(m, "conv_kernel_size")]


def _install(model: Any) -> None:
    """Swap each linear layer's conv1d class for its noting subclass and wrap its module's recurrence, once."""
    for layer in _linear_layers(model):
        conv = layer.conv1d
        if not getattr(type(conv), "_notes_input", False):
            conv.__class__ = _noting(type(conv))
        module = sys.modules[type(layer).__module__]
        if not getattr(module.gated_delta_update, "_steps", False):
            module.gated_delta_update = _stepping(module.gated_delta_update)


_NOTING: dict[type, type] = {}


def _noting(cls: type) -> type:
    if cls not in _NOTING:
        def __call__(self, x):
            if _active is not None:
                _active.conv = x
            return cls.__call__(self, x)
        _NOTING[cls] = type(cls.__name__, (cls,), {"__call__": __call__, "_notes_input": True})
    return _NOTING[cls]


def _stepping(update):
    """gated_delta_update that, while recording, runs one token at a time and keeps the state after each."""

    def stepping(q, k, v, a, b, A_log, dt_bias, state=None, mask=None, **kw):
        cache = _active.by_state.get(id(state)) if _active is not None and state is not None else None
        if cache is None:
            return update(q, k, v, a, b, A_log, dt_bias, state, mask, **kw)
        ys, states = [], []
        for t in range(q.shape[1]):
            y, state = update(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], a[:, t:t + 1], b[:, t:t + 1], A_log,
                              dt_bias, state, None if mask is None else mask[:, t:t + 1], **kw)
            ys.append(y)
            states.append(state)
        _active.kept[id(cache)] = (_active.conv, mx.stack(states, axis=1))
        _active.conv = None
        return mx.concatenate(ys, axis=1), state

    stepping._steps = True
    return stepping
