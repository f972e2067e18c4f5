"""Zoo models that speak a family's own chat format: demo-tiny's tokenizer plus the family's special tokens,
and the family's real chat template, so that rank 0 recognises the format and parses and enforces its calls.

The family's plain zoo model keeps demo-tiny's tokenizer and template (other tests rely on its prompts); these
are models of their own, on the same architecture and weights drawn the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from engine.modelgen.store import write_json
from engine.modelgen.tokenizer import ENDOFTEXT, tokenizer_config, train_tokenizer


@dataclass(frozen=True)
class Speech:
    """A family's tokens and template. Special tokens are those the real tokenizer marks special (dropped by
    decode(skip_special_tokens=True)); added ones stay in decoded text."""

    template: str  # a file of engine/zoo/templates
    special: tuple[str, ...]
    added: tuple[str, ...]
    eos: tuple[str, ...]  # what ends generation (generation_config.json), the first the tokenizer's eos_token
    bos: str | None = None


SPEECH = {
    # gpt-oss (o200k_harmony): every harmony marker is special; <|return|> and <|call|> end a turn.
    "gpt-oss-harmony": Speech("gpt-oss.jinja", special=("<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                                                        "<|constrain|>", "<|return|>", "<|call|>"),
                              added=(), eos=("<|return|>", "<|call|>", ENDOFTEXT)),
    # DeepSeek-V3.1: the sentence markers are special, the chat and tool markers plain added tokens.
    "deepseek-v3.1-tools": Speech(
        "deepseek-v3.1.jinja", special=("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
        added=("<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
               "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>",
               "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"),
        eos=("<｜end▁of▁sentence｜>",), bos="<｜begin▁of▁sentence｜>"),
    # DeepSeek-V3.2: V3.1's chat tokens; its DSML call markup is text to this tokenizer.
    "deepseek-v3.2-tools": Speech(
        "deepseek-v3.2.jinja", special=("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
        added=("<｜User｜>", "<｜Assistant｜>"), eos=("<｜end▁of▁sentence｜>",), bos="<｜begin▁of▁sentence｜>"),
}


def template(speech: Speech) -> str:
    return resources.files(__package__).joinpath("templates", speech.template).read_bytes().decode("utf-8")


def write_tokenizer(out: Path, name: str, vocab_size: int, context_length: int) -> tuple[dict[str, int], list[str]]:
    """demo-tiny's tokenizer with the family's tokens added, its template and end tokens, written into `out`;
    returns its vocabulary and the family's tokens."""
    from tokenizers import AddedToken

    speech = SPEECH[name]
    tok = train_tokenizer(vocab_size, 0)
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in speech.special])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in speech.added])
    tok.save(str(out / "tokenizer.json"), pretty=False)
    vocab = tok.get_vocab()
    eos = [vocab[t] for t in speech.eos]
    write_json(out / "generation_config.json", {"bos_token_id": vocab.get(speech.bos or ""), "eos_token_id": eos,
                                                "pad_token_id": vocab[ENDOFTEXT]})
    config = tokenizer_config(context_length)
    # No tool_parser_type: mlx-lm has no parser for these formats, rank 0 recognises them from the template.
    del config["tool_parser_type"]
    config.update(chat_template=template(speech), eos_token=speech.eos[0], bos_token=speech.bos)
    write_json(out / "tokenizer_config.json", config)
    write_json(out / "special_tokens_map.json", {"bos_token": speech.bos, "eos_token": speech.eos[0],
                                                 "pad_token": ENDOFTEXT})
    return vocab, list(speech.special + speech.added)
