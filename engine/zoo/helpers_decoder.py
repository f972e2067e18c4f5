"""Zoo helper models of the decoder-embedding family (engine/helpers/families/decoder_embed.py): a tiny
Qwen3-Embedding, built offline with mlx-lm's qwen3 class and the zoo's tokenizer, and saved as the hub's checkpoint
is (the bare model: no "model." prefix, no lm_head, embeddings tied), so loading it takes the real model's path.

    EMBEDDING_MODEL=zoo-qwen3-embedding ./launch.sh start
"""

from __future__ import annotations

from pathlib import Path

# tokens an input may have: short, so that tests exceed it cheaply (Qwen3-Embedding takes 32768)
CONTEXT_LENGTH = 512
MODELS = ("qwen3-embedding",)


def generate(name: str, out: Path) -> dict:
    """Write zoo helper `name` into the existing directory `out`; return its marker (without the version)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import get_total_parameters, save_config

    from engine.modelgen.tokenizer import ENDOFTEXT, IM_END, quiet_ids, write_tokenizer
    from engine.zoo.configs import HIDDEN, config
    from engine.zoo.store import FILLER_WORDS, VOCAB
    from engine.zoo.weights import build

    vocab = write_tokenizer(out, VOCAB, FILLER_WORDS, CONTEXT_LENGTH)
    cfg = config("qwen3", VOCAB, vocab[IM_END], vocab[ENDOFTEXT]) | {
        "tie_word_embeddings": True, "max_position_embeddings": CONTEXT_LENGTH}
    model, cfg = build(cfg, HIDDEN, quiet_ids(vocab), quantized=False)
    tensors = {k.removeprefix("model."): v for k, v in sorted(tree_flatten(model.parameters()))}
    mx.save_safetensors(str(out / "model.safetensors"), tensors, metadata={"format": "pt"})
    save_config(cfg, out / "config.json")
    return {"name": name, "model_type": cfg["model_type"], "parameters": get_total_parameters(model),
            "vocab_size": VOCAB, "dimensions": cfg["hidden_size"]}
