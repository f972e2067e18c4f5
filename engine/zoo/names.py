"""The zoo's model names, without the "zoo-" prefix (plain data: `launch.sh check` reads ZOO_MODELS
without importing the project). Each family also comes 4-bit, quantized as mlx_lm.convert does."""

FAMILIES = ("llama", "qwen3", "qwen3-moe", "qwen3.5", "qwen3-next", "deepseek-v3", "gpt-oss", "glm4-moe",
            "ministral3")
QUANTIZED_SUFFIX = "-4bit"
ZOO_MODELS = tuple(name for family in FAMILIES for name in (family, family + QUANTIZED_SUFFIX))
# Models of a family that speak its own chat format (its template and special tokens: engine/zoo/formats.py),
# by the family whose architecture they have.
FORMAT_MODELS = {"gpt-oss-harmony": "gpt-oss", "deepseek-v3.1-tools": "deepseek-v3"}
# Every name MODEL=zoo-... accepts.
SERVED_MODELS = ZOO_MODELS + tuple(FORMAT_MODELS)
