"""A zoo family built in memory with heads wide enough for KV quantization: random weights, no files.

The zoo's heads are 16 numbers wide, below every group mx.quantize accepts (32, 64, 128), so no zoo model can
store its keys and values in KV_BITS. Measuring what quantization saves per cache kind (plain KV, MLA's latent,
sliding windows, linear attention beside full attention) needs the same layer pattern with wider heads; nothing
here is measured in memory (bench/kv_bytes.py, tests/integration/test_kv_measure.py); engine/zoo/store.py writes
a few to disk (engine.zoo.names.WIDE_MODELS: zoo-deepseek-v3-wide, ...) to serve them with KV_BITS.
"""

from __future__ import annotations

import importlib
from typing import Any

from engine.zoo.configs import config

# every key that sets a width of what the caches keep, where a family's config has it
WIDTHS = ("head_dim", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "linear_key_head_dim",
          "linear_value_head_dim")
# MLA's latent: kept per token in place of K and V, so widened with the heads
LATENT = "kv_lora_rank"


def wide_config(family: str, width: int = 64) -> dict[str, Any]:
    """The zoo's config of family (engine.zoo.names.FAMILIES) with every head width, and MLA's latent, at width."""
    return widened(config(family, vocab=256, eos_id=1, pad_id=0), width)


def widened(cfg: dict[str, Any], width: int = 64) -> dict[str, Any]:
    """A zoo config with every head width its family sets, and MLA's latent (twice as wide), at width."""
    widen = {key: width for key in WIDTHS} | {LATENT: 2 * width}
    if "text_config" in cfg:  # a vision-language checkpoint: the language model's own config
        return cfg | {"text_config": _wider(cfg["text_config"], widen)}
    return _wider(cfg, widen)


def _wider(cfg: dict[str, Any], widen: dict[str, int]) -> dict[str, Any]:
    return cfg | {key: value for key, value in widen.items() if key in cfg}


def wide_model(family: str, width: int = 64) -> Any:
    """mlx-lm's own model class of family, built from wide_config (float32, randomly initialised)."""
    cfg = wide_config(family, width)
    arch = importlib.import_module(f"mlx_lm.models.{cfg['model_type']}")
    return arch.Model(arch.ModelArgs.from_dict(cfg))
