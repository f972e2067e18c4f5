"""Tool-call formats, one module per format (engine/toolformats/base.py says what each knows).

A module is named after the format, as mlx-lm names its parsers (mlx_lm/tool_parsers/<name>.py, chosen from the
chat template), and holds FORMAT, its ToolFormat. Formats mlx-lm has no parser for are recognised here.
"""

from __future__ import annotations

import importlib
from typing import Any

from engine.toolformats.base import ToolFormat


def format_named(name: str) -> ToolFormat | None:
    """The format of that name, None when there is no module for it."""
    if not name.isidentifier():
        return None
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError:
        return None
    return getattr(module, "FORMAT", None)


def format_name(tokenizer: Any) -> str:
    """The tokenizer's tool-call format: one mlx-lm has no parser for, recognised here, else mlx-lm's choice
    ("" when the model has none)."""
    own = _own_format(tokenizer)
    if own:
        return own
    parser = getattr(tokenizer, "tool_parser", None)
    return getattr(parser, "__module__", "").rsplit(".", 1)[-1] if parser is not None else ""


def for_tokenizer(tokenizer: Any) -> ToolFormat | None:
    name = format_name(tokenizer)
    return format_named(name) if name else None


def _own_format(tokenizer: Any) -> str:
    """Formats recognised from the chat template or vocabulary where mlx-lm recognises none ("": none)."""
    if getattr(tokenizer, "tool_parser", None) is not None:
        return ""
    template = getattr(tokenizer, "chat_template", None)
    template = template if isinstance(template, str) else ""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # a tokenizer without a vocabulary to read: the template alone decides
        vocab = {}
    # gpt-oss: the channels and the end of a call are its own special tokens
    if "<|channel|>" in template and "<|call|>" in template or all(
            t in vocab for t in ("<|channel|>", "<|message|>", "<|call|>", "<|constrain|>")):
        return "harmony"
    # DeepSeek V3.2 and V4: DSML. V3.2's release renders chats in Python, which mlx-lm runs as its chat template
    # type deepseek_v32 (the tokenizer then has no template text); a template that writes DSML names its block.
    if "｜DSML｜" in template:
        return "dsml" if "function_calls" in template else "dsml_v4"
    if (getattr(tokenizer, "init_kwargs", None) or {}).get("chat_template_type") == "deepseek_v32":
        return "dsml"
    # DeepSeek V3, R1, V3.1: the template writes the calls section; V3 and R1 fence the arguments
    if "<｜tool▁calls▁begin｜>" in template or (not template and "<｜tool▁calls▁begin｜>" in vocab):
        return "deepseek_v3" if "```json" in template else "deepseek"
    return ""
