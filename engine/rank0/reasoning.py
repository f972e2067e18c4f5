"""A reasoning level (OpenAI's reasoning_effort) as this model's chat template takes it.

Templates say what they take by the variables they read: gpt-oss's harmony template reads
`reasoning_effort` (low, medium, high), Qwen3's reads `enable_thinking` (an on/off switch), most read
neither. A level goes to the first kind as the nearest level it knows, turns the second kind's
thinking on ("minimal" off), and changes nothing for the third.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

# the levels a template that reads reasoning_effort knows, for each level a client may ask
TEMPLATE_LEVEL = {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}


def template_source(hf_tokenizer: Any) -> str:
    """The chat template's text: a string, or a model's named templates (a mapping, or a list of
    {"name", "template"}) joined; "" when the tokenizer has none."""
    template = getattr(hf_tokenizer, "chat_template", None)
    if isinstance(template, str):
        return template
    if isinstance(template, dict):
        return "\n".join(str(t) for t in template.values())
    if isinstance(template, list):
        return "\n".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    return ""


class ReasoningLevels:
    """What the template takes, read once from its source."""

    def __init__(self, source: str):
        self.takes_effort = "reasoning_effort" in source
        self.takes_switch = "enable_thinking" in source

    def options(self, effort: str, enable_thinking: bool | None) -> dict[str, Any]:
        """The chat template's keyword arguments for a level ("" none) and an explicit switch (None: none)."""
        options: dict[str, Any] = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        if not effort:
            return options
        if self.takes_effort:
            options["reasoning_effort"] = TEMPLATE_LEVEL[effort]
        elif self.takes_switch:
            options.setdefault("enable_thinking", effort != "minimal")  # an explicit switch wins
        else:
            log.debug("reasoning_effort %r changes nothing: this model's chat template takes no reasoning level "
                      "and no thinking switch", effort)
        return options
