"""DeepSeek's call markup (V3, R1, V3.1): a section of calls, each a name and its JSON arguments.

DeepSeek-V3.1's chat template (and the model card) writes

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{"a": 1}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>

with several calls chained without separators. V3 and R1 wrote the type, then the name and fenced JSON:
`<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>`, calls joined by a
newline. Both are parsed whichever the template is; a forced call is written as the template writes calls
(deepseek_v3 names the fenced variant). Thinking is `<think>`/`</think>`, which the tokenizer's own tokens
already route. V3.2 and V4 write DSML instead, another format.
"""

from __future__ import annotations

import json
import re
from typing import Any

from engine.toolformats.base import GrammarParts, ToolFormat
from engine.toolformats.cut import json_so_far
from engine.toolformats.tools import allowed

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"

# V3's fenced variant after the separator: the name, a newline and the arguments in a json fence.
_FENCED = re.compile(r"(?s)\s*([^\n]+?)\s*\n```(?:json)?\s*\n(.*?)\n?```\s*")


class DeepSeek(ToolFormat):
    name = "deepseek"
    start = CALLS_BEGIN
    end = CALLS_END
    fenced = False  # how a forced call is written: V3.1's plain JSON, or V3's fence

    def parse(self, text: str, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        """Every whole call in the section (one cut short before its end marker is left out)."""
        calls = []
        for piece in text.split(CALL_BEGIN)[1:]:
            body, closed, _ = piece.partition(CALL_END)
            if not closed:
                continue
            calls.append(_call(body))
        if not calls:
            raise ValueError("no whole DeepSeek call in the text")
        return calls

    def grammar(self, parts: GrammarParts, tools: list[dict[str, Any]], named: str | None, parallel: bool) -> str:
        sep = parts.literal(SEP)
        bodies = []
        for tool in allowed(tools, named):
            if self.fenced:
                bodies.append(f"\"function\" {sep} {json.dumps(tool.name + chr(10) + '```json' + chr(10))} "
                              f"{parts.json(tool.schema, tool.blame)} \"\\n```\"")
            else:
                bodies.append(f"{json.dumps(tool.name)} {sep} {parts.json(tool.schema, tool.blame)}")
        call = f"{parts.literal(CALL_BEGIN)} deepseek_body {parts.literal(CALL_END)}"
        between = ' "\\n" ' if self.fenced else " "
        several = parallel and named is None
        return "\n".join([
            f"calls: {parts.literal(CALLS_BEGIN)} deepseek_call{f'({between}deepseek_call)*' if several else ''} "
            f"{parts.literal(CALLS_END)}",
            f"deepseek_call: {call}",
            "deepseek_body: " + " | ".join(bodies),
        ])

    def partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> tuple[str | None, str]:
        pieces = text.split(CALL_BEGIN)
        last = pieces[-1] if len(pieces) > 1 else ""
        if CALL_END in last or SEP not in last:
            return None, ""
        left, _, right = last.partition(SEP)
        if left.strip() != "function":
            return left.strip(), json_so_far(right, CALL_END)
        name, newline, rest = right.partition("\n")
        if not newline:
            return None, ""
        fence, fenced, rest = rest.partition("```json")
        return name.strip(), json_so_far(rest, "```") if fenced and not fence.strip() else ""


def _call(body: str) -> dict[str, Any]:
    left, sep, right = body.partition(SEP)
    if not sep:
        raise ValueError(f"a DeepSeek call without {SEP}")
    fenced = _FENCED.fullmatch(right) if left.strip() == "function" else None
    name, arguments = (fenced.group(1), fenced.group(2)) if fenced else (left.strip(), right)
    if not name:
        raise ValueError("a DeepSeek call without a function name")
    value = json.loads(arguments)
    if not isinstance(value, dict):
        raise ValueError(f"a DeepSeek call's arguments are a JSON object, not {type(value).__name__}")
    return {"name": name, "arguments": value}


FORMAT = DeepSeek()


class DeepSeekFenced(DeepSeek):
    name = "deepseek_v3"
    fenced = True


FENCED = DeepSeekFenced()
