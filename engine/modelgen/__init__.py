"""What every generated model shares: the tokenizer, the random draws, and the cache folder they live in.

engine/demo (the default Qwen3 demo models) and engine/zoo (one tiny model per architecture family)
build on this floor, so their tokenizers are the same and token ids compare across them.
"""
