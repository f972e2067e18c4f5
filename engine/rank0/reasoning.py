"""A reasoning level (OpenAI's reasoning_effort) as this model's chat template takes it.

Templates say what they take by the variables they read: gpt-oss's harmony template reads
`reasoning_effort` (low, medium, high), Qwen3's and GLM's read `enable_thinking` (an on/off switch),
DeepSeek V3.1's reads `thinking` (the same switch by another name), most read none. A level goes to the
first kind as the nearest level it knows, turns the switch of the others on ("minimal" off), and changes
nothing for the last. A model whose chat template is mlx-lm's Python (mlx_lm/chat_templates/<type>.py,
DeepSeek V3.2's) is read from that module's source.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
from typing import Any

log = logging.getLogger(__name__)

# the levels a template that reads reasoning_effort knows, for each level a client may ask
TEMPLATE_LEVEL = {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}
# DeepSeek V3.1's switch: `{% if not thinking is defined %}`, `{%- if not thinking %}</think>`
_THINKING = re.compile(r"\bthinking\s+is\s+(not\s+)?defined|\bif\s+(not\s+)?thinking\b")


def template_source(hf_tokenizer: Any) -> str:
    """The chat template's text: a string, or a model's named templates (a mapping, or a list of
    {"name", "template"}) joined, or the source of mlx-lm's module its chat_template_type names; "" when the
    tokenizer has none."""
    template = getattr(hf_tokenizer, "chat_template", None)
    if isinstance(template, str):
        return template
    if isinstance(template, dict):
        return "\n".join(str(t) for t in template.values())
    if isinstance(template, list):
        return "\n".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    kind = (getattr(hf_tokenizer, "init_kwargs", None) or {}).get("chat_template_type")
    if isinstance(kind, str) and kind.isidentifier():
        try:
            return inspect.getsource(importlib.import_module(f"mlx_lm.chat_templates.{kind}"))
        except (ImportError, OSError):  # mlx-lm has no such module: the model renders without one
            return ""
    return ""


class ReasoningLevels:
    """What the template takes, read once from its source."""

    def __init__(self, source: str):
        self.takes_effort = "reasoning_effort" in source
        # the thinking switch's name, None when the template has none
        self.switch = "enable_thinking" if "enable_thinking" in source else \
            "thinking" if _THINKING.search(source) else None

    def options(self, effort: str, enable_thinking: bool | None) -> dict[str, Any]:
        """The chat template's keyword arguments for a level ("" none) and an explicit switch (None: none)."""
        switch = self.switch or "enable_thinking"
        options: dict[str, Any] = {} if enable_thinking is None else {switch: enable_thinking}
        if not effort:
            return options
        if self.takes_effort:
            options["reasoning_effort"] = TEMPLATE_LEVEL[effort]
        elif self.switch:
            options.setdefault(switch, effort != "minimal")  # an explicit switch wins
        else:
            log.debug("reasoning_effort %r changes nothing: this model's chat template takes no reasoning level "
                      "and no thinking switch", effort)
        return options
