"""`python -m bench.random_checkpoint OUT --tokenizer-from FOLDER`: a random-weight model of a real checkpoint's
shape, 4-bit, made without any download: for throughput where per-step overhead shows at realistic step times.

The model is mlx-lm's own `llama` class with Llama-3-8B's config (32 layers, hidden 4096, 32 heads, 8 KV heads,
MLP 14336, vocabulary 128256), its weights MLX's random initialisation in bfloat16, quantized by `nn.quantize`
(4 bits, group 64) as `mlx_lm.convert -q` would. The tokenizer is another model's (`--tokenizer-from`, e.g.
SmolLM2's folder) with its vocabulary padded by plain-letter pieces to the config's size, so every id the random
model samples decodes. `--shape tiny` is a few-MB stand-in of the same build, to try the path on a CPU.

    python -m bench.random_checkpoint /tmp/llama3-8b-random --tokenizer-from ~/.cache/mlx-cluster-serve/smollm2-135m-v1
"""

from __future__ import annotations

import argparse
import json
import shutil
import string
import sys
import time
from pathlib import Path

LLAMA3_8B = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 8192, "tie_word_embeddings": False,
    "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16",
}
SHAPES = {
    "llama3-8b": LLAMA3_8B,
    "tiny": {**LLAMA3_8B, "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8,
             "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 50000},
}
QUANTIZATION = {"group_size": 64, "bits": 4}


def pad_vocab(tokenizer_json: dict, size: int) -> dict:
    """The tokenizer with its BPE vocabulary padded to `size` ids by distinct lowercase pieces (no merges make
    them, so encoding is unchanged; decoding gives each one as its letters)."""
    vocab = tokenizer_json["model"]["vocab"]
    ids = set(vocab.values()) | {t["id"] for t in tokenizer_json.get("added_tokens") or ()}
    letters, n, next_id, taken = string.ascii_lowercase, 0, max(ids) + 1, len(ids)
    while taken < size:
        k, piece = n, ""
        while True:  # n in base 26, at least 4 letters: none of these is a real piece of the vocabulary
            piece = letters[k % 26] + piece
            k //= 26
            if k == 0 and len(piece) >= 4:
                break
        n += 1
        if piece in vocab:
            continue
        vocab[piece] = next_id
        next_id += 1
        taken += 1
    return tokenizer_json


def build(out: Path, shape: str, tokenizer_from: Path) -> dict:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_lm.models.llama import Model, ModelArgs
    from mlx_lm.utils import save_model

    started = time.perf_counter()
    source = json.loads((tokenizer_from / "config.json").read_text())
    config = {**SHAPES[shape], "bos_token_id": source.get("bos_token_id"), "eos_token_id": source.get("eos_token_id"),
              "quantization": QUANTIZATION}
    out.mkdir(parents=True, exist_ok=True)
    mx.random.seed(0)
    model = Model(ModelArgs.from_dict(config))
    model.set_dtype(mx.bfloat16)
    nn.quantize(model, **QUANTIZATION)
    for layer in [model.model.embed_tokens, *model.model.layers, model.lm_head]:
        mx.eval(layer.parameters())  # one layer at a time: the full-precision randoms never all live at once
    save_model(out, model)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    tok = pad_vocab(json.loads((tokenizer_from / "tokenizer.json").read_text()), config["vocab_size"])
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    for name in ("tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (tokenizer_from / name).is_file():
            shutil.copy(tokenizer_from / name, out / name)
    params = sum(v.size for _, v in tree_flatten(model.parameters()))
    return {"folder": str(out), "shape": shape, "stored_parameters": int(params),
            "bytes": sum(f.stat().st_size for f in out.glob("*.safetensors")),
            "seconds": round(time.perf_counter() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.random_checkpoint", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    parser.add_argument("--tokenizer-from", type=Path, required=True,
                        help="a model folder whose tokenizer (and chat template) the random model gets")
    args = parser.parse_args(argv)
    print(json.dumps(build(args.out, args.shape, args.tokenizer_from.expanduser())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
