"""One module per vision-language family: `matches(config) -> bool` and `load(folder, config) -> Tower`
(engine/vision/tower.py says what a Tower answers). Listed in the order they are asked."""

FAMILIES = ("gemma3", "mistral3", "qwen2_5_vl", "qwen3_vl", "qwen3_5")
