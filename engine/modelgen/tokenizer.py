"""The generated models' tokenizer: byte-level BPE trained on corpus.txt, with Qwen's special and added tokens."""

from __future__ import annotations

from importlib import resources

from engine.modelgen.draws import SEED

# Qwen's layout: the ChatML tokens are special (dropped by decode(skip_special_tokens=True)); the
# think and tool tokens are plain added tokens, so they survive decoding and the server's parsers see
# them in the text. Single tokens matter: mlx-lm finds reasoning and tool calls by token ids.
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
ADDED_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

# Pseudo-words pad the corpus so the merge budget of a large vocab is reached: the prose alone runs
# out of pairs after about 1400 merges. The prose is repeated three times and each pseudo-word
# appears twice, so every English merge (count >= 3) is learnt before any whole pseudo-word.
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def data(name: str) -> str:
    """A data file shipped in this package (corpus.txt, chat_template.jinja), exactly as written."""
    return resources.files(__package__).joinpath(name).read_bytes().decode("utf-8")


def chat_template() -> str:
    """Qwen3's template, trimmed: no reasoning_content bookkeeping. mlx-lm picks its "json_tools"
    parser because the template names both "<tool_call>" and "tool_call.name"."""
    return data("chat_template.jinja")


def _filler_lines(count: int) -> list[str]:
    import numpy as np

    if count == 0:
        return []

    rng = np.random.default_rng([SEED, 1])
    words = [
        "".join(_SYLLABLES[int(i)] for i in rng.integers(0, len(_SYLLABLES), int(n)))
        for n in rng.integers(2, 5, count)
    ]
    # Each pseudo-word appears twice: the trainer's min_frequency=2 ignores pairs seen once.
    tokens = [words[i % count] for i in rng.permutation(2 * count)]
    return [" ".join(tokens[i : i + 12]) + "." for i in range(0, len(tokens), 12)]


def train_tokenizer(vocab_size: int, filler_words: int, extra: tuple[tuple[str, bool], ...] = ()):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    # Byte-level: every byte is in the alphabet, so any unicode text round-trips; and mlx-lm picks
    # its BPE streaming detokenizer when the decoder is ByteLevel.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(ADDED_TOKENS),
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The training text: what matters is that common English, numbers, punctuation, JSON and
    # ChatML/tool-call markup all get sensible merges.
    corpus = data("corpus.txt").splitlines(keepends=True) * 3 + [line + "\n" for line in _filler_lines(filler_words)]
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, wanted {vocab_size}")
    # A model family's own markers go on top, after the demo vocabulary: every other id stays the demo's.
    for text, special in extra:
        if special:
            tok.add_special_tokens([AddedToken(text, special=True, normalized=False)])
        else:
            tok.add_tokens([AddedToken(text, special=False, normalized=False)])
    return tok


def _byte_decoder() -> dict[str, int]:
    # GPT-2's byte-to-unicode table, which the ByteLevel pre-tokenizer uses, inverted.
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = dict(zip(printable, printable))
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in chars.items()}


def quiet_ids(vocab: dict[str, int], extra: tuple[str, ...] = ()) -> list[int]:
    """Tokens the random model should (almost) never pick: special and added tokens (extra: a family's
    markers), and pieces that are not whole printable UTF-8 on their own (stray bytes, control characters)."""
    decoder = _byte_decoder()
    quiet = {vocab[t] for t in SPECIAL_TOKENS + ADDED_TOKENS + extra}
    for piece, idx in vocab.items():
        if idx in quiet:
            continue
        try:
            text = bytes(decoder[c] for c in piece).decode("utf-8")
        except UnicodeDecodeError:
            quiet.add(idx)
            continue
        if any(not ch.isprintable() and ch not in "\n\t" for ch in text):
            quiet.add(idx)
    return sorted(quiet)


def tokenizer_config(context_length: int, template: str | None = None, tool_parser: str | None = "json_tools") -> dict:
    """tokenizer_config.json; tool_parser None leaves the format for mlx-lm to infer from the template."""
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": context_length,
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "tool_parser_type": tool_parser,
        "chat_template": chat_template() if template is None else template,
    }
    if tool_parser is None:
        del config["tool_parser_type"]
    return config


def write_tokenizer(out, vocab_size: int, filler_words: int, context_length: int,
                    extra: tuple[tuple[str, bool], ...] = (), template: str | None = None,
                    tool_parser: str | None = "json_tools") -> dict[str, int]:
    """Train the tokenizer and write its files (tokenizer.json, its config, the special tokens and the
    generation config) into `out`; return its vocabulary. extra: (text, special) markers added on top of
    the vocabulary; template and tool_parser: see tokenizer_config."""
    from engine.modelgen.store import write_json

    tok = train_tokenizer(vocab_size, filler_words, extra)
    tok.save(str(out / "tokenizer.json"), pretty=False)
    vocab = tok.get_vocab()
    eos_id, pad_id = vocab[IM_END], vocab[ENDOFTEXT]
    write_json(out / "generation_config.json", {"bos_token_id": None, "eos_token_id": [eos_id, pad_id],
                                                "pad_token_id": pad_id})
    write_json(out / "tokenizer_config.json", tokenizer_config(context_length, template, tool_parser))
    write_json(out / "special_tokens_map.json", {"eos_token": IM_END, "pad_token": ENDOFTEXT})
    return vocab
