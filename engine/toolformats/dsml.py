"""DeepSeek V3.2's and V4's call markup, DSML: XML-style invokes, every tag marked with `｜DSML｜`.

DeepSeek-V3.2's release renders chats with Python rather than Jinja (encoding/encoding_dsv32.py; mlx-lm ships
the same code as mlx_lm/chat_templates/deepseek_v32.py), and writes calls after the content as

    \\n\\n<｜DSML｜function_calls>
    <｜DSML｜invoke name="NAME">
    <｜DSML｜parameter name="KEY" string="true">raw text</｜DSML｜parameter>
    <｜DSML｜parameter name="KEY" string="false">{"a": 1}</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

several invokes joined by a newline. A string value is written as it is (string="true"), any other as JSON
(string="false"); a forced call follows engine/toolformats/tools.py's rule: a parameter whose schema says
"type": "string" is raw text that cannot contain the closing tag, every other one JSON. DeepSeek-V4 writes the
same invokes in a `tool_calls` block (dsml_v4). Thinking is `<think>`/`</think>`, as in V3.1.
"""

from __future__ import annotations

import json
import re
from typing import Any

from engine.toolformats import xml
from engine.toolformats.base import GrammarParts, ToolFormat
from engine.toolformats.cut import held
from engine.toolformats.tools import allowed, declared_properties, parameters, raw_string

DSML = "｜DSML｜"
INVOKE, INVOKE_END = f'<{DSML}invoke name="', f"</{DSML}invoke>"
PARAMETER, PARAMETER_END = f'<{DSML}parameter name="', f"</{DSML}parameter>"

_INVOKE = re.compile(rf'<{DSML}invoke\s+name="([^"]*)"\s*>(.*?){re.escape(INVOKE_END)}', re.S)
_PARAMETER = re.compile(rf'<{DSML}parameter\s+name="([^"]*)"(?:\s+string="(true|false)")?\s*>(.*?)'
                        rf"{re.escape(PARAMETER_END)}", re.S)


class Dsml(ToolFormat):
    """The invokes of one block; `block` is its tag's name (V3.2: function_calls, V4: tool_calls)."""

    def __init__(self, name: str, block: str):
        self.name = name
        self.start, self.end = f"<{DSML}{block}>", f"</{DSML}{block}>"

    def parse(self, text: str, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        """Every whole invoke in the block (one cut short before its closing tag is left out)."""
        calls = []
        for match in _INVOKE.finditer(text):
            name, body = match.group(1).strip(), match.group(2)
            if not name:
                raise ValueError("a DSML invoke without a function name")
            calls.append({"name": name, "arguments": _arguments(body, name, tools)})
        if not calls:
            raise ValueError("no whole DSML invoke in the text")
        return calls

    def grammar(self, parts: GrammarParts, tools: list[dict[str, Any]], named: str | None, parallel: bool) -> str:
        """The block as the encoding writes it: one parameter a line, string="true" for raw text."""
        bodies = []
        for tool in allowed(tools, named):
            raw = {key: raw_string(schema) for key, schema, _ in parameters(tool)}
            args = xml.arguments(
                parts, tool, lambda key: json.dumps(f'{PARAMETER}{key}" string="{str(raw[key]).lower()}">'),
                PARAMETER_END + "\n", forbid=(PARAMETER_END, INVOKE_END, self.end))
            bodies.append(f'{json.dumps(f"{INVOKE}{tool.name}{chr(34)}>{chr(10)}")} {args} {json.dumps(INVOKE_END)}')
        invoke = parts.rule(" | ".join(bodies))
        several = f'("\\n" {invoke})*' if parallel and named is None else ""
        return f'calls: {parts.literal(self.start)} "\\n" {invoke} {several} "\\n" {parts.literal(self.end)}'

    def partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> tuple[str | None, str]:
        """The last invoke's name once its tag is whole, and its arguments so far as a prefix of their JSON."""
        head, found, last = text.rpartition(INVOKE)
        if not found or INVOKE_END in last or '">' not in last:
            return None, ""
        name, _, body = last.partition('">')
        done = [f"{json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}"
                for k, v in _arguments(body, name, None).items()]
        rest = body.rpartition(PARAMETER_END)[2] if PARAMETER_END in body else body
        key, opened, value = rest.partition(PARAMETER)[2].partition('">')
        if opened:  # a parameter cut inside its value
            key, _, kind = key.partition('" string="')
            value = held(value, PARAMETER_END)  # the closing tag cut after its first characters
            written = json.dumps(value, ensure_ascii=False)[:-1] if kind != "false" else value
            done.append(f"{json.dumps(key, ensure_ascii=False)}: {written}")
        return name.strip(), "{" + ", ".join(done)


def _arguments(body: str, name: str, tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    """An invoke's parameters: string="true" as written, string="false" as the JSON it spells (text that is
    no JSON stays the model's words); without the attribute, the tool's schema says which."""
    props = declared_properties(name, tools)
    out: dict[str, Any] = {}
    for match in _PARAMETER.finditer(body):
        key, kind, value = match.groups()
        if kind is None:
            kind = "true" if raw_string(props.get(key) or {}) else "false"
        if kind == "false":
            try:
                value = json.loads(value)
            except ValueError:
                pass
        out[key] = value
    return out


FORMAT = Dsml("dsml", "function_calls")
V4 = Dsml("dsml_v4", "tool_calls")
