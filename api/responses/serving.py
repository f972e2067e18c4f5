"""Responses request -> the same engine Generate the chat endpoint sends (kind "chat").

Input items become OpenAI-shaped chat messages the engine's chat template renders and tools become
function tools, so one conversation gives one prompt (and the same greedy tokens) whichever dialect
it arrives in. This server keeps nothing between requests: what needs a stored response is refused.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from msgspec import UNSET

import ipc
from ipc.messages import REASONING_EFFORTS
from api.access import escape
from api.errors import InvalidRequest
from api.images import ImageRef, check_image_role, message_content
from api.request_checks import Refusal, check_depth, check_model, max_tokens_within, refuse_unsupported
from api.responses.protocol import InputContent, InputItem, ResponsesRequest, ResponseTool, TextConfig, ToolChoice
from api.schemas import closed
from config import Settings

logger = logging.getLogger(__name__)

# Codex's namespace for top-level tools: its functions keep their own names in the prompt
DEFAULT_NAMESPACE = "functions"
# what turns logprobs on (top_logprobs > 0 does too)
LOGPROBS_INCLUDE = "message.output_text.logprobs"

REFUSED: dict[str, Refusal] = {
    "background": (lambda v: v in (None, False),
                   "a background response is fetched later, and this server keeps none; send background false"),
    "conversation": (lambda v: v is None, "this server keeps no conversations; send the whole conversation in input"),
    "previous_response_id": (lambda v: v is None,
                             "this server keeps no responses; resend the conversation in input"),
    "prompt": (lambda v: v is None, "this server keeps no prompt templates; send instructions and input instead"),
}

# Tool types left out of the prompt, logged once each; bounded, since clients name the types
_left_out: set[str] = set()
MAX_LOGGED_TOOL_TYPES = 64


def new_response_id() -> str:
    """The response id, also the request id on the wire."""
    return f"resp_{uuid.uuid4().hex}"


def prompt_name(namespace: str | None, name: str) -> str:
    """The name a namespace's function has in the prompt: its own in Codex's default namespace, else
    qualified by the namespace as MCP tools are named (mcp__server__tool)."""
    if not namespace or namespace == DEFAULT_NAMESPACE:
        return name
    return namespace + name if namespace.endswith("__") else f"{namespace}__{name}"


@dataclass
class ToolSet:
    """The function tools the model sees, and where each prompt name came from: (namespace, name)."""

    tools: list[dict[str, Any]] = field(default_factory=list)
    origin: dict[str, tuple[str | None, str]] = field(default_factory=dict)

    def find(self, name: str) -> str | None:
        """The prompt name a client means by name: a prompt name, or a namespaced function's own name
        when only one namespace has it."""
        if name in self.origin:
            return name
        matches = [p for p, (namespace, own) in self.origin.items() if namespace and own == name]
        return matches[0] if len(matches) == 1 else None

    def only(self, names: set[str]) -> ToolSet:
        return ToolSet([t for t in self.tools if t["function"]["name"] in names], self.origin)


def responses_generate(req: ResponsesRequest, request_id: str, settings: Settings) -> tuple[ipc.Generate, ToolSet]:
    """The engine request for req, and the tools it offers (to name the calls that come back)."""
    check_model(req.model, settings)
    refuse_unsupported(req, REFUSED)
    if req.text is not None and req.text.verbosity not in (None, "medium"):
        raise InvalidRequest(
            f"Unsupported parameter: 'text.verbosity' = {req.text.verbosity!r} is not supported by this server "
            "(only 'medium'; the model's answers are as long as it makes them).",
            param="text.verbosity", code="unsupported_parameter")
    toolset = engine_tools(req.tools or [])
    choice, offered = engine_tool_choice(req.tool_choice, toolset)
    messages = engine_messages(req)
    logprobs = LOGPROBS_INCLUDE in (req.include or ()) or bool(req.top_logprobs)
    effort = req.reasoning.effort if req.reasoning else None
    params = ipc.SamplingParams(
        # absent, as OpenAI's Responses API has it, the answer may run to the context's end: agents such as Codex
        # send no limit and report a turn cut short as an error
        max_tokens=max_tokens_within(req.max_output_tokens, "max_output_tokens", settings),
        max_tokens_default=req.max_output_tokens is None,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        seed=req.seed,
        logprobs=logprobs,
        top_logprobs=(req.top_logprobs or 0) if logprobs else 0,
    )
    msg = ipc.Generate(
        request_id=request_id,
        kind="chat",
        params=params,
        messages=messages,
        tools=offered.tools or None,
        tool_choice=choice,
        parallel_tool_calls=req.parallel_tool_calls is not False,
        json_schema=_json_schema(req.text),
        # "none" turns thinking off through the chat template; a level reaches the template as it takes one; a
        # level this server does not know keeps the template's default
        enable_thinking=False if effort == "none" else None,
        reasoning_effort=effort if effort in REASONING_EFFORTS else "",
    )
    return msg, toolset


# ---------------------------------------------------------------- input


def engine_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The conversation in the chat template's shape: instructions first, then every input item in order."""
    out: list[dict[str, Any]] = []
    if req.instructions:
        out.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        out.append({"role": "user", "content": req.input})
        return out
    for i, item in enumerate(req.input):
        _add_item(out, item, f"input[{i}]")
    if not out:
        raise InvalidRequest("Invalid value for 'input': it holds no message (reasoning items are dropped); send "
                             "at least one message.", param="input")
    return out


def _add_item(out: list[dict[str, Any]], item: InputItem, param: str) -> None:
    kind = item.type if item.type is not UNSET else ("message" if item.role is not UNSET else None)
    if kind == "message":
        out.append(_message(item, param))
    elif kind == "function_call":
        _function_call(out, item, param)
    elif kind == "function_call_output":
        out.append(_function_call_output(item, param))
    elif kind == "reasoning":
        return  # earlier reasoning is dropped, as the chat endpoint drops reasoning sent back
    elif kind == "item_reference":
        raise InvalidRequest(f"Invalid value for '{param}.type': 'item_reference' points to an item stored by the "
                             "server, and this server keeps none; send the item itself.", param=f"{param}.type")
    elif kind is None:
        raise InvalidRequest(f"Missing required parameter: '{param}.type' (or '{param}.role' for a message).",
                             param=f"{param}.type")
    else:
        raise InvalidRequest(f"Invalid value for '{param}.type': {_shown(kind)} is not an input item this server "
                             "accepts (message, function_call, function_call_output, reasoning).",
                             param=f"{param}.type")


def _message(item: InputItem, param: str) -> dict[str, Any]:
    if item.role is UNSET:
        raise InvalidRequest(f"Missing required parameter: '{param}.role'.", param=f"{param}.role")
    if item.content is UNSET or item.content is None:
        raise InvalidRequest(f"Missing required parameter: '{param}.content'.", param=f"{param}.content")
    content: Any = item.content
    if not isinstance(content, str):
        content = message_content([_part(part, item.role, f"{param}.content[{j}]") for j, part in enumerate(content)])
    # developer is read as system, as the chat endpoint does
    return {"role": "system" if item.role == "developer" else item.role, "content": content}


def _part(part: InputContent, role: str, param: str) -> str | ImageRef:
    if part.type in ("input_text", "output_text"):
        if part.text is UNSET:
            raise InvalidRequest(f"Missing required parameter: '{param}.text'.", param=f"{param}.text")
        return part.text
    if part.type == "refusal":
        if part.refusal is UNSET:
            raise InvalidRequest(f"Missing required parameter: '{param}.refusal'.", param=f"{param}.refusal")
        return part.refusal
    if part.type == "input_image":
        check_image_role(role, param)
        return _image(part.image_url, part.file_id, param)
    raise _refused_part(part.type, param, "input_text, output_text, refusal, input_image")


def _image(url: Any, file_id: Any, param: str) -> ImageRef:
    """An input_image's image_url; a file_id names a file in OpenAI's store, which this server does not have."""
    if isinstance(file_id, str):
        raise InvalidRequest(f"Invalid value for '{param}.file_id': this server keeps no files; send the image in "
                             "image_url as a data URL (data:image/png;base64,...) or an http(s) URL.",
                             param=f"{param}.file_id")
    if not isinstance(url, str):
        raise InvalidRequest(f"Missing required parameter: '{param}.image_url' (a data URL or an http(s) URL).",
                             param=f"{param}.image_url")
    return ImageRef("url", url, f"{param}.image_url")


def _refused_part(kind: str, param: str, accepted: str) -> InvalidRequest:
    if kind in ("input_file", "input_audio"):
        return InvalidRequest(f"Invalid value for '{param}.type': {kind} content is not supported by this server "
                              "(text and images only).", param=f"{param}.type")
    return InvalidRequest(f"Invalid value for '{param}.type': {_shown(kind)} (accepted: {accepted}).",
                          param=f"{param}.type")


def _function_call(out: list[dict[str, Any]], item: InputItem, param: str) -> None:
    """An earlier call becomes a tool call of an assistant message; calls in a row share one message, which
    is how the chat endpoint's assistant turn with several tool calls reads."""
    for name in ("call_id", "name"):
        if getattr(item, name) is UNSET:
            raise InvalidRequest(f"Missing required parameter: '{param}.{name}'.", param=f"{param}.{name}")
    assert isinstance(item.name, str) and isinstance(item.call_id, str)
    args: Any = "{}" if item.arguments is UNSET else item.arguments
    if isinstance(args, str):
        try:
            # chat templates read arguments as a mapping (`arguments | tojson`, `arguments.items()`)
            args = json.loads(args or "{}")
        except (json.JSONDecodeError, RecursionError):
            raise InvalidRequest(f"Invalid value for '{param}.arguments': not JSON; send the call's arguments as a "
                                 "JSON object in a string.", param=f"{param}.arguments") from None
    check_depth(args, f"{param}.arguments")
    call = {"id": item.call_id, "type": "function",
            "function": {"name": prompt_name(item.namespace or None, item.name), "arguments": args}}
    if out and out[-1]["role"] == "assistant":
        out[-1].setdefault("tool_calls", []).append(call)
    else:
        out.append({"role": "assistant", "content": "", "tool_calls": [call]})


def _function_call_output(item: InputItem, param: str) -> dict[str, Any]:
    if item.call_id is UNSET:
        raise InvalidRequest(f"Missing required parameter: '{param}.call_id'.", param=f"{param}.call_id")
    output = item.output
    if output is UNSET:
        raise InvalidRequest(f"Missing required parameter: '{param}.output'.", param=f"{param}.output")
    if isinstance(output, list):
        output = message_content([_output_part(part, f"{param}.output[{j}]") for j, part in enumerate(output)])
    elif not isinstance(output, str):
        raise InvalidRequest(f"Invalid value for '{param}.output': send the call's result as a string or a list of "
                             "input_text and input_image parts.", param=f"{param}.output")
    # the chat endpoint's tool message, key for key
    return {"role": "tool", "content": output, "tool_call_id": item.call_id}


def _output_part(part: Any, param: str) -> str | ImageRef:
    """A part of a function call's output (loose JSON): input_text, or input_image (a screenshot a tool took)."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "input_image":
        return _image(part.get("image_url"), part.get("file_id"), param)
    if kind != "input_text":
        raise _refused_part(kind if isinstance(kind, str) else repr(part)[:40], param, "input_text, input_image")
    if not isinstance(part.get("text"), str):
        raise InvalidRequest(f"Missing required parameter: '{param}.text'.", param=f"{param}.text")
    return part["text"]


# ---------------------------------------------------------------- tools


def engine_tools(tools: list[ResponseTool]) -> ToolSet:
    """Function tools, and those of namespace tools, as OpenAI function tools; hosted tools are left out."""
    toolset = ToolSet()
    where: dict[str, str] = {}
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        if tool.type == "function":
            _add_function(toolset, where, None, tool, param)
        elif tool.type == "namespace":
            if tool.name is UNSET:
                raise InvalidRequest(f"Missing required parameter: '{param}.name'.", param=f"{param}.name")
            for j, nested in enumerate(tool.tools or ()):
                if nested.type == "function":
                    _add_function(toolset, where, tool.name, nested, f"{param}.tools[{j}]")
                else:
                    _leave_out(nested.type)
        else:
            _leave_out(tool.type)
    return toolset


def _add_function(toolset: ToolSet, where: dict[str, str], namespace: str | None, tool: ResponseTool,
                  param: str) -> None:
    if tool.name is UNSET:
        raise InvalidRequest(f"Missing required parameter: '{param}.name'.", param=f"{param}.name")
    name = prompt_name(namespace, tool.name)
    if name in where:
        raise InvalidRequest(f"Invalid value for '{param}.name': the model would see two tools named {name!r} "
                             f"(this one and {where[name]}); give them different names.", param=f"{param}.name")
    where[name] = param
    # absent fields stay absent, as with the chat endpoint's tools: chat templates render them as JSON
    function: dict[str, Any] = {"name": name}
    if tool.description is not UNSET:
        function["description"] = tool.description
    if tool.parameters is not UNSET:
        check_depth(tool.parameters, f"{param}.parameters")
        function["parameters"] = tool.parameters
    if tool.strict is not UNSET:
        function["strict"] = tool.strict
    toolset.tools.append({"type": "function", "function": function})
    toolset.origin[name] = (namespace, tool.name)


def _leave_out(kind: str) -> None:
    """Hosted tools (web_search, file_search, mcp, ...) run on OpenAI's side; the model cannot call them here.
    They are not refused: clients such as Codex send them with every request."""
    if kind in _left_out or len(_left_out) >= MAX_LOGGED_TOOL_TYPES:
        return
    _left_out.add(kind)
    logger.info("tools of type %s are left out of the prompt: this server cannot run them", _shown(kind))


def engine_tool_choice(choice: ToolChoice | None, toolset: ToolSet) -> tuple[str | dict[str, Any] | None, ToolSet]:
    """The wire's tool_choice, and the tools offered with it (allowed_tools narrows them)."""
    if choice is None:
        return None, toolset
    names = ", ".join(toolset.origin) or "none given"
    if isinstance(choice, str):
        if choice == "required" and not toolset.tools:
            raise InvalidRequest("Invalid value for 'tool_choice': 'required' needs function tools (hosted tools are "
                                 "left out here).", param="tool_choice")
        return choice, toolset
    if choice.type == "function":
        if choice.name is UNSET:
            raise InvalidRequest("Missing required parameter: 'tool_choice.name'.", param="tool_choice.name")
        name = toolset.find(choice.name)
        if name is None:
            raise InvalidRequest(f"Invalid value for 'tool_choice.name': function {choice.name!r} is not among the "
                                 f"tools ({names}).", param="tool_choice.name")
        return {"type": "function", "function": {"name": name}}, toolset
    if choice.type == "allowed_tools":
        allowed = _allowed(choice.tools if choice.tools is not UNSET else [], toolset, names)
        mode = choice.mode if choice.mode is not UNSET else "auto"
        offered = toolset.only(allowed)
        if mode == "required" and not offered.tools:
            raise InvalidRequest("Invalid value for 'tool_choice.tools': mode 'required' needs a function tool.",
                                 param="tool_choice.tools")
        return mode, offered
    raise InvalidRequest(f"Invalid value for 'tool_choice.type': {_shown(choice.type)} chooses a hosted tool, which "
                         "this server cannot run; use 'auto', 'none', 'required', a function or allowed_tools.",
                         param="tool_choice.type")


def _allowed(entries: list[dict[str, Any]], toolset: ToolSet, names: str) -> set[str]:
    allowed = set()
    for k, entry in enumerate(entries):
        if entry.get("type") != "function":
            continue  # hosted tools are left out anyway
        name = entry.get("name")
        found = toolset.find(name) if isinstance(name, str) else None
        if found is None:
            raise InvalidRequest(f"Invalid value for 'tool_choice.tools[{k}].name': {_shown(name)} is not among the "
                                 f"function tools ({names}).", param=f"tool_choice.tools[{k}].name")
        allowed.add(found)
    return allowed


def _json_schema(text: TextConfig | None) -> dict[str, Any] | None:
    """The schema constrained decoding enforces: json_object is any object."""
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "object"}
    assert fmt.schema is not UNSET
    check_depth(fmt.schema, "text.format.schema")
    # strict reads objects as closed, as chat's response_format does
    return closed(fmt.schema) if fmt.strict is True else fmt.schema


def _shown(value: Any) -> str:
    text = repr(value)
    return escape(text if len(text) <= 60 else text[:57] + "...")
