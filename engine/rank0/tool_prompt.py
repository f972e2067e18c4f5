"""Tools for a model whose chat template has no tool syntax (SmolLM2's plain ChatML, many base and small models).

Such a template drops `tools` and a history's tool calls and results, so the model would never learn of them. As
production servers do for these models, the tools are described in the system message instead, with the envelope
to call them in: the `json_tools` one (`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`), which
rank 0 then parses like any format's and enforces with its grammar when tool_choice forces a call
(engine/rank0/output.py falls back to it for a model without a tool-call format of its own). Earlier calls are
written back in that envelope and tool results as user turns, so a conversation reads as one the model could have
written. Whether a template renders tools is asked of the template itself, once, at load.
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger(__name__)

# the envelope INSTRUCTIONS describe: engine/toolformats/json_tools.py parses and enforces it
FALLBACK_FORMAT = "json_tools"

# a tool no real request names: found in the rendered text only where the template writes tools
_PROBE = {"type": "function", "function": {"name": "probe_tool_zq7x", "description": "probe",
                                            "parameters": {"type": "object", "properties": {}}}}

INSTRUCTIONS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}}\n</tool_call>")


def renders_tools(render) -> bool:
    """Whether the chat template writes the tools it is given; render(messages, tools) -> text."""
    messages = [{"role": "user", "content": "hello"}]
    try:
        return _PROBE["function"]["name"] in render(messages, [_PROBE])
    except Exception:  # a template that rejects the probe's shape is asked no further: it renders its own tools
        log.debug("the chat template raised on a probe tool; taking it to render tools", exc_info=True)
        return True


def with_tools_described(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """messages for a template without tool syntax: the tools (if any) in the system message (a new one first when
    there is none), earlier calls in the assistant's text, tool results as user turns."""
    out = [dict(m) for m in messages]
    if tools:
        described = INSTRUCTIONS.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        if out and out[0].get("role") == "system":
            out[0]["content"] = f"{out[0].get('content') or ''}\n\n{described}".lstrip("\n")
        else:
            out.insert(0, {"role": "system", "content": described})
    for i, m in enumerate(out):
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = [_envelope(c) for c in m.pop("tool_calls")]
            m["content"] = "\n".join(([m["content"]] if m.get("content") else []) + calls)
        elif m.get("role") == "tool":
            out[i] = {"role": "user", "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"}
    return out


def _envelope(call: dict[str, Any]) -> str:
    """An earlier call as the model would have written it (the API has made its arguments a mapping)."""
    fn = call.get("function") or call
    body = {"name": fn.get("name"), "arguments": fn.get("arguments") or {}}
    return f"<tool_call>\n{json.dumps(body, ensure_ascii=False)}\n</tool_call>"
