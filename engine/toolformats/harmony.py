"""gpt-oss's harmony format: every message of a turn in a channel, calls as commentary messages to a function.

After the prompt's `<|start|>assistant` the model writes messages, each headed by its channel:

    <|channel|>analysis<|message|>reasoning<|end|>
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
    <|start|>assistant<|channel|>final<|message|>the answer<|return|>

The recipient may also come before the channel (`<|start|>assistant to=functions.NAME<|channel|>commentary
json<|message|>{...}`, as the chat template writes past calls); both are read. `<|call|>` and `<|return|>` end
the turn (they are end-of-sequence tokens), so a turn makes at most one call. The headers are no one's text:
RESPONSE_FORMAT (mlx-lm's way of describing channel formats, mlx_lm/chat_templates/muse_spark.py) drops them,
routes analysis to reasoning, final and commentary without a recipient to content, and a call to the parser.
"""

from __future__ import annotations

import json
import re
from typing import Any

from engine.toolformats.base import GrammarParts, ToolFormat
from engine.toolformats.tools import allowed

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, CALL, RETURN = "<|constrain|>", "<|call|>", "<|return|>"
RECIPIENT = "to=functions."
# The special tokens of the format (all special in gpt-oss's tokenizer): text of theirs is never content.
MARKERS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, CALL, RETURN)

RESPONSE_FORMAT: dict[str, Any] = {
    "initial_state": "header",
    "transitions": {
        # A header's own text (the role, the channel's name, a content type) is dropped.
        "header": [
            (f"{CHANNEL}analysis{MESSAGE}", "reasoning"),
            (f"{CHANNEL}final{MESSAGE}", "normal"),
            (f"{CHANNEL}commentary{MESSAGE}", "normal"),  # a preamble the user sees
            (RECIPIENT, "tool"),
        ],
        "reasoning": [(END, "header"), (START, "header")],
        "normal": [(END, "header"), (START, "header"), (RETURN, "header")],
        # A call the model ends as a message rather than with <|call|> ends all the same.
        "tool": [(END, "header")],
    },
}

# The function's name: up to the space, channel or content type that follows it.
_NAME = re.compile(r"([^\s<]+)(?=[\s<])")


class Harmony(ToolFormat):
    name = "harmony"
    start = RECIPIENT
    end = CALL
    response_format = RESPONSE_FORMAT

    def parse(self, text: str, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        """`NAME <|constrain|>json<|message|>{...}` or `NAME<|channel|>commentary json<|message|>{...}`."""
        head, sep, body = text.partition(MESSAGE)
        name = _NAME.match(head + " ")
        if not sep or name is None:
            raise ValueError(f"not a harmony call: no function name and {MESSAGE}")
        arguments = json.loads(body)
        if not isinstance(arguments, dict):
            raise ValueError(f"a harmony call's arguments are a JSON object, not {type(arguments).__name__}")
        return [{"name": name.group(1), "arguments": arguments}]

    def grammar(self, parts: GrammarParts, tools: list[dict[str, Any]], named: str | None, parallel: bool) -> str:
        """The call as gpt-oss writes it, right after the prompt's `<|start|>assistant`: its channel first,
        then the recipient and the content type. One call, parallel or not: <|call|> ends the turn."""
        calls = []
        for tool in allowed(tools, named):
            calls.append(f"{json.dumps(tool.name + ' ')} {parts.literal(CONSTRAIN)} \"json\" {parts.literal(MESSAGE)} "
                         f"{parts.json(tool.schema, tool.blame)}")
        return "\n".join([
            f"calls: {parts.literal(CHANNEL)} \"commentary {RECIPIENT}\" harmony_call {parts.literal(CALL)}",
            "harmony_call: " + " | ".join(calls),
        ])

    def partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> tuple[str | None, str]:
        head, sep, body = text.partition(MESSAGE)
        name = _NAME.match(head if not sep else head + " ")
        if name is None:
            return None, ""
        return name.group(1), body


FORMAT = Harmony()
