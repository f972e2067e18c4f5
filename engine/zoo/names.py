"""The zoo's model names, without the "zoo-" prefix (plain data: `launch.sh check` reads ZOO_MODELS
without importing the project). Each family also comes 4-bit, quantized as mlx_lm.convert does; each
tool-call format has a small Qwen3 of its own whose tokenizer and chat template are that family's."""

FAMILIES = ("llama", "qwen3", "qwen3-moe", "qwen3.5", "qwen3-next", "deepseek-v3", "gpt-oss", "glm4-moe",
            "ministral3")
QUANTIZED_SUFFIX = "-4bit"
ARCH_MODELS = tuple(name for family in FAMILIES for name in (family, family + QUANTIZED_SUFFIX))
# Named as mlx-lm names its tool parsers (mlx_lm/tool_parsers/<format>.py); engine/zoo/tool_families.py
# holds each one's markers and chat template.
TOOLS_PREFIX = "tools-"
TOOL_FORMATS = ("qwen3_coder", "glm47", "kimi_k2", "mistral", "minimax_m2", "longcat", "minicpm5", "muse_spark",
                "pythonic", "gemma4", "function_gemma", "kimi_k3")
TOOL_MODELS = tuple(TOOLS_PREFIX + name for name in TOOL_FORMATS)
# Models of a family that speak its own chat format (its template and special tokens: engine/zoo/formats.py),
# by the family whose architecture they have.
FORMAT_MODELS = {"gpt-oss-harmony": "gpt-oss", "deepseek-v3.1-tools": "deepseek-v3",
                 "deepseek-v3.2-tools": "deepseek-v3"}
# Models of a family in another real checkpoint's shape (engine/zoo/configs.py SHAPES), by that family:
# llama-9-heads has SmolLM2's 9 query and 3 KV heads, which 2 ranks cannot split but 3 can.
SHAPE_MODELS = {"llama-9-heads": "llama"}
ZOO_MODELS = ARCH_MODELS + TOOL_MODELS + tuple(FORMAT_MODELS) + tuple(SHAPE_MODELS)
# A family with heads 64 wide (engine/zoo/wide.py), by family: the zoo's heads of 16 are too narrow for KV_BITS,
# so these serve plain KV, MLA's latent and sliding windows quantized. Generated on request only (not in ZOO_MODELS).
WIDE_SUFFIX = "-wide"
WIDE_MODELS = {family + WIDE_SUFFIX: family for family in ("llama", "deepseek-v3", "ministral3")}
# MLA's latent wide enough for KV_BITS, with a trained MTP head: SPECULATIVE=mtp served with quantized KV
WIDE_MODELS["deepseek-v3-wide-mtp-trained"] = "deepseek-v3"
# A family carrying multi-token-prediction layers (engine/zoo/mtp.py), by family; "-trained": its head trained
# on the main model's own greedy continuations, so drafts get accepted. Generated on request only.
MTP_MODELS = {"deepseek-v3-mtp": "deepseek-v3", "glm4-moe-mtp": "glm4-moe", "deepseek-v3-mtp-trained": "deepseek-v3",
              "qwen3-next-mtp": "qwen3-next", "qwen3.5-mtp": "qwen3.5", "qwen3.5-mtp-trained": "qwen3.5",
              "qwen3.5-moe-mtp": "qwen3.5-moe",  # qwen3.5-moe: a family served with heads only (configs.py)
              "deepseek-v3-wide-mtp-trained": "deepseek-v3"}
# Vision-language models built from mlx-vlm's classes (engine/zoo/vision.py). Generated on request only.
VISION_MODELS = ("gemma3-vision", "mistral3-vision", "qwen2_5_vl-vision", "qwen3_vl-vision", "qwen3_5-vision")
# Every name MODEL=zoo-... accepts (a wide mtp one is both wide and mtp).
SERVED_MODELS = tuple(dict.fromkeys(ZOO_MODELS + tuple(WIDE_MODELS) + tuple(MTP_MODELS) + VISION_MODELS))
