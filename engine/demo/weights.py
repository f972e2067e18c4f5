"""The demo model's random weights: uniform draws keyed by tensor name (engine.modelgen.draws)."""

from __future__ import annotations

import math

from engine.demo.specs import Spec
from engine.modelgen.draws import uniform as _uniform


def weights(spec: Spec, config: dict, quiet_ids: list[int]) -> dict:
    """Every parameter of mlx-lm's qwen3 model for config, by name."""
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3

    # Build the real model only for its parameter names and shapes, so they always match what this
    # mlx-lm version loads.
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    out = {}
    for name, param in sorted(tree_flatten(model.parameters())):
        shape = tuple(param.shape)
        if len(shape) == 1:  # RMSNorm scales
            value = np.ones(shape, dtype=np.float32)
        elif name.endswith("embed_tokens.weight"):
            # Big embeddings keep the residual stream token-dependent, so greedy output varies.
            value = _uniform(name, shape, 1.0)
        elif name == "lm_head.weight":
            value = _uniform(name, shape, 2.0 / math.sqrt(spec.hidden))
            # Tiny logits for special tokens: a random model should not stop at once, nor emit
            # stray <tool_call>/<think> tokens that send the server's parsers down odd paths. And for
            # broken UTF-8 pieces, so that streamed text equals the decoded text, as with real models.
            value[quiet_ids] *= 0.05
        else:
            value = _uniform(name, shape, 1.0 / math.sqrt(shape[1]))
        out[name] = mx.array(value)
    return out
