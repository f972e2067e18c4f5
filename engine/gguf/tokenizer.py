"""The GGUF's GPT-2-style byte-level BPE (`tokenizer.ggml.*`) as a Hugging Face tokenizer.json and its config.

The pre-tokenizer is llama.cpp's for `tokenizer.ggml.pre` = "smollm": every digit alone, then GPT-2's regex
over byte-level text; control tokens (token_type 3) are special, matched whole before BPE sees the text.
"""

from __future__ import annotations

from pathlib import Path

CONTROL = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL
_PRE_TOKENIZERS = ("smollm",)


def _id(meta: dict, key: str) -> int | None:
    return int(meta[key].item()) if key in meta else None


def build(meta: dict):
    """A `tokenizers.Tokenizer` saying exactly what the GGUF's vocabulary and merges say."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    if meta.get("tokenizer.ggml.model") != "gpt2" or meta.get("tokenizer.ggml.pre") not in _PRE_TOKENIZERS:
        raise ValueError(f"unsupported GGUF tokenizer {meta.get('tokenizer.ggml.model')!r} "
                         f"(pre {meta.get('tokenizer.ggml.pre')!r}): only gpt2 with {', '.join(_PRE_TOKENIZERS)}")
    tokens = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False,
                               byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    types = meta["tokenizer.ggml.token_type"].tolist()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types) if kind == CONTROL])
    return tok


def write(meta: dict, out: Path, context_length: int) -> None:
    """tokenizer.json, tokenizer_config.json (with the GGUF's chat template) and generation_config.json."""
    from engine.modelgen.store import write_json

    build(meta).save(str(out / "tokenizer.json"), pretty=False)
    tokens = meta["tokenizer.ggml.tokens"]
    bos, eos = _id(meta, "tokenizer.ggml.bos_token_id"), _id(meta, "tokenizer.ggml.eos_token_id")
    pad, unk = _id(meta, "tokenizer.ggml.padding_token_id"), _id(meta, "tokenizer.ggml.unknown_token_id")
    name = lambda i: None if i is None else tokens[i]  # noqa: E731
    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": context_length,
        "bos_token": name(bos),
        "eos_token": name(eos),
        "pad_token": name(pad if pad is not None else eos),
        "unk_token": name(unk),
        "add_bos_token": bool(add_bos.item()) if add_bos is not None else False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": meta["tokenizer.chat_template"],
    })
    write_json(out / "generation_config.json", {"bos_token_id": bos, "eos_token_id": eos,
                                                "pad_token_id": pad if pad is not None else eos})
