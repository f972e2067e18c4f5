"""The zoo's random weights, by parameter name, for any of mlx-lm's model classes; and their 4-bit form."""

from __future__ import annotations

import contextlib
import importlib
import math
import sys

from engine.modelgen.draws import uniform

GROUP_SIZE, BITS = 64, 4  # mlx_lm.convert's defaults for -q


def _value(family: str, name: str, shape: tuple[int, ...], hidden: int, quiet_ids: list[int]):
    """A deterministic value for the parameter `name`: scaled so that activations stay near unit size
    through every layer, and greedy decoding wanders over the vocabulary instead of repeating a token."""
    import numpy as np

    def draw(std: float, low: float | None = None):
        # Keyed by family too: families sharing parameter names (llama, qwen3, ministral3) would
        # otherwise hold the same tensors and answer alike, hiding a wrong model behind right output.
        return uniform(f"{family}/{name}", shape, std, low)

    last = name.rsplit(".", 1)[-1]
    if name.endswith("lm_head.weight"):
        value = draw(2.0 / math.sqrt(hidden))
        # Tiny logits for special and broken-UTF-8 tokens, as in the demo model (engine/demo/weights.py).
        value[quiet_ids] *= 0.05
        return value
    if name.endswith("embed_tokens.weight"):
        # Big embeddings keep the residual stream token-dependent, so greedy output varies.
        return draw(1.0)
    if last in ("bias", "e_score_correction_bias"):
        return draw(0.02)
    if last == "sinks":  # gpt-oss: one attention-sink logit per head
        return draw(0.5)
    if last == "A_log":  # Gated DeltaNet decay: log of A drawn from (0, 16) as at initialisation
        return draw(math.log(16.0) / (2.0 * math.sqrt(3.0)), low=0.0)
    if last == "dt_bias":
        return np.ones(shape, dtype=np.float32)
    if len(shape) == 1:  # every other vector is a norm's scale
        if "norm" not in name:
            raise ValueError(f"no rule for the vector parameter {name}: add one to engine/zoo/weights.py")
        return np.ones(shape, dtype=np.float32)
    if name.endswith("conv1d.weight"):  # depthwise (channels, kernel, 1): each output sums one kernel
        return draw(1.0 / math.sqrt(shape[1]))
    return draw(1.0 / math.sqrt(shape[-1]))


def build(config: dict, hidden: int, quiet_ids: list[int], quantized: bool):
    """mlx-lm's own model for `config` with every parameter drawn by name; quantized as
    `mlx_lm.convert -q` does when asked. Returns (model, config as mlx-lm would write it)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.utils import quantize_model

    arch = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = arch.Model(arch.ModelArgs.from_dict(config))
    family = config["model_type"]
    params = sorted(tree_flatten(model.parameters()))
    values = [(n, mx.array(_value(family, n, tuple(p.shape), hidden, quiet_ids))) for n, p in params]
    model.update(tree_unflatten(values))
    if not quantized:
        return model, config
    # On the CPU: the quantized bytes are then one function of the float weights on every host.
    with mx.stream(mx.cpu), contextlib.redirect_stdout(sys.stderr):  # it prints its bits per weight
        return quantize_model(model, config, GROUP_SIZE, BITS)
