"""The zoo's model names, without the "zoo-" prefix (plain data: `launch.sh check` reads ZOO_MODELS
without importing the project). Each family also comes 4-bit, quantized as mlx_lm.convert does."""

FAMILIES = ("llama", "qwen3", "qwen3-moe", "qwen3.5", "qwen3-next", "deepseek-v3", "gpt-oss", "glm4-moe",
            "ministral3")
QUANTIZED_SUFFIX = "-4bit"
ZOO_MODELS = tuple(name for family in FAMILIES for name in (family, family + QUANTIZED_SUFFIX))
