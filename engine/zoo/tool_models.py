"""The zoo models that write tool calls, and the tool-call format each one's tokenizer gets (engine/toolformats).

The format is read from the tokenizer as the engine reads it, never written down a second time: a zoo model
added for a new format is picked up by every caller that walks this list (the property tests of
tests/integration/test_toolformats_props.py, bench/tool_grammars.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.zoo.names import FORMAT_MODELS, TOOL_MODELS

# qwen3 is the demo tokenizer's format (json_tools); the others have a format each.
TOOL_CALLING_MODELS = ("qwen3", *TOOL_MODELS, *FORMAT_MODELS)


def load_tool_model_tokenizer(name: str, cache_dir: Path) -> tuple[str, Any]:
    """(format name, mlx-lm tokenizer) of zoo model `name`, generated into cache_dir when missing."""
    from mlx_lm.utils import load_tokenizer

    from engine import toolformats
    from engine.zoo.store import ensure_zoo_model

    tokenizer = load_tokenizer(ensure_zoo_model(name, cache_dir))
    return toolformats.format_name(tokenizer), tokenizer
