"""The model zoo: one tiny random-weight model per architecture family people serve, built offline.

The demo model is one architecture (Qwen3, plain KV cache). Real clusters serve hybrids of linear
and full attention (Qwen3.5, Qwen3-Next: `ArraysCache` and `KVCache` layers), sliding windows with
attention sinks (gpt-oss, Ministral 3: `RotatingKVCache`), latent attention (DeepSeek-V3 and Kimi
K2: one compressed latent per token) and mixtures of experts, usually 4-bit. Each zoo model is
built from mlx-lm's own model class for its `model_type`, with a config.json shaped like the real
checkpoint's (engine/zoo/configs.py), weights drawn by parameter name (engine/zoo/weights.py) and
demo-tiny's tokenizer and chat template (engine/modelgen), so token ids compare across models.
Every model also comes 4-bit, quantized by mlx-lm's `quantize_model` as `mlx_lm.convert -q` does.

Like the demo models, every file is a pure function of the code (the 4-bit ones of the code and
the platform's MLX CPU arithmetic), so each host of a cluster generates its own copy on first use.
Everything is float32: MLX's CPU backend runs the experts' gather-matmul in float32 only.

    python -m engine.zoo [--list] [--cache-dir DIR] [NAME ...]   # prints each model's path
    MODEL=zoo-qwen3.5 ./launch.sh start
"""

from engine.zoo.names import FAMILIES, FORMAT_MODELS, SERVED_MODELS, ZOO_MODELS
from engine.zoo.store import MARKER_FILE, PREFIX, VERSION, ensure_zoo_model, zoo_model_path

__all__ = ["FAMILIES", "FORMAT_MODELS", "SERVED_MODELS", "MARKER_FILE", "PREFIX", "VERSION", "ZOO_MODELS", "ensure_zoo_model", "zoo_model_path"]
