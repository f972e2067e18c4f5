"""Anthropic Messages request -> the same engine Generate the chat endpoint sends (kind "chat").

Messages become OpenAI-shaped chat messages the engine's chat template renders, tools become
function tools, so one conversation gives one prompt (and the same greedy tokens) whichever
dialect it arrives in.
"""

from __future__ import annotations

import uuid
from typing import Any

from msgspec import UNSET

import ipc
from api.anthropic.protocol import ContentBlock, CountTokensRequest, InputMessage, MessagesRequest, Tool, ToolChoice
from api.errors import InvalidRequest
from api.images import ImageRef, message_content
from api.request_checks import check_depth, check_model, max_tokens_within
from api.schemas import closed
from config import Settings

# Anthropic's effort levels (the engine's reasoning levels, which hold them all)
EFFORTS = ("low", "medium", "high", "xhigh", "max")
# Claude Code's first system block: it changes between versions and sessions, so it would end the
# cached prefix at the prompt's first line; it says nothing to the model.
BILLING_HEADER = "x-anthropic-billing-header:"


def new_message_id() -> str:
    """The Anthropic message id, also the request id on the wire."""
    return f"msg_{uuid.uuid4().hex}"


def messages_generate(req: MessagesRequest, request_id: str, settings: Settings) -> ipc.Generate:
    check_model(req.model, settings)
    tools = engine_tools(req.tools or [])
    params = ipc.SamplingParams(
        max_tokens=max_tokens_within(req.max_tokens, "max_tokens", settings),
        temperature=1.0 if req.temperature is UNSET else req.temperature,
        top_p=1.0 if req.top_p is UNSET else req.top_p,
        top_k=0 if req.top_k is UNSET or req.top_k < 0 else req.top_k,
        seed=req.seed,
        stop=list(req.stop_sequences or ()),
    )
    return ipc.Generate(
        request_id=request_id,
        kind="chat",
        params=params,
        messages=engine_messages(req),
        tools=tools or None,
        tool_choice=engine_tool_choice(req.tool_choice or None, tools),
        parallel_tool_calls=not (req.tool_choice and req.tool_choice.disable_parallel_tool_use),
        json_schema=output_schema(req),
        enable_thinking=_thinking(req),
        reasoning_effort=effort(req),
    )


def count_generate(req: CountTokensRequest, request_id: str, settings: Settings) -> ipc.Generate:
    """req as a one-token generation: its messages, tools and thinking switch are what count_tokens tokenises
    (building it checks them as create() would)."""
    check_model(req.model, settings)
    tools = engine_tools(req.tools or [])
    return ipc.Generate(
        request_id=request_id,
        kind="chat",
        params=ipc.SamplingParams(max_tokens=1),
        messages=engine_messages(req),
        tools=tools or None,
        tool_choice=engine_tool_choice(req.tool_choice or None, tools),
        enable_thinking=_thinking(req),
        reasoning_effort=effort(req),
    )


def output_schema(req: CountTokensRequest) -> dict[str, Any] | None:
    """The schema of output_config.format (or of the beta's output_format), enforced like OpenAI's response_format.

    Anthropic's structured outputs read every object as closed (its API wants additionalProperties false on each):
    an object with properties that does not say gets it here; one that says is enforced as it says.
    """
    fmt = req.output_config.format if req.output_config else None
    param = "output_config.format.schema"
    if fmt is None and req.output_format:
        fmt, param = req.output_format, "output_format.schema"
    if fmt is None:
        return None
    check_depth(fmt.schema, param)
    return closed(fmt.schema)


def effort(req: CountTokensRequest) -> str:
    """output_config.effort as the engine's reasoning level ("" when absent); one this server does not know: 400."""
    level = req.output_config.effort if req.output_config else None
    if level is None:
        return ""
    if level not in EFFORTS:
        raise InvalidRequest(f"Invalid value for 'output_config.effort': {level[:40]!r} is not a level this server "
                             f"knows; use one of {', '.join(EFFORTS)}.", param="output_config.effort")
    return level


def _thinking(req: CountTokensRequest) -> bool | None:
    """enabled/disabled switch the template's thinking; adaptive leaves the template's default."""
    if not req.thinking:
        return None
    return {"enabled": True, "disabled": False}.get(req.thinking.type)


def engine_messages(req: CountTokensRequest) -> list[dict[str, Any]]:
    """The conversation in the chat template's shape: the system first, then every message in order."""
    out: list[dict[str, Any]] = []
    system = _system_text(req.system or "")
    if system:
        out.append({"role": "system", "content": system})
    for i, message in enumerate(req.messages):
        out.extend(_engine_message(message, f"messages[{i}]"))
    return out


def _system_text(system: str | list[ContentBlock]) -> str:
    if isinstance(system, str):
        return system
    texts = []
    for i, block in enumerate(system):
        text = _text_of(block, f"system[{i}]")
        if not text.startswith(BILLING_HEADER):
            texts.append(text)
    return "\n".join(texts)


def _text_of(block: ContentBlock, param: str) -> str:
    if block.type != "text":
        _refuse(block, param, "only text blocks are accepted here")
    if block.text is UNSET:
        raise InvalidRequest(f"Missing required parameter: '{param}.text'.", param=f"{param}.text")
    return block.text


def _refuse(block: ContentBlock, param: str, accepted: str) -> None:
    if block.type == "image":
        raise InvalidRequest(f"Invalid value for '{param}.type': image blocks are taken in user messages and tool "
                             "results only; move the image to a user message.", param=f"{param}.type")
    if block.type == "document":
        raise InvalidRequest(f"Invalid value for '{param}.type': document content blocks are not supported by "
                             "this server (text and images only).", param=f"{param}.type")
    raise InvalidRequest(f"Invalid value for '{param}.type': {block.type!r} ({accepted}).", param=f"{param}.type")


def _text_or_image(block: ContentBlock, param: str) -> str | ImageRef:
    """A user message's or a tool result's block: text, or an image (base64 or url source)."""
    if block.type != "image":
        return _text_of(block, param)
    source = block.source
    if source is UNSET:
        raise InvalidRequest(f"Missing required parameter: '{param}.source'.", param=f"{param}.source")
    if source.type == "base64" and source.data is not UNSET:
        return ImageRef("base64", source.data, f"{param}.source")
    if source.type == "url" and source.url is not UNSET:
        return ImageRef("url", source.url, f"{param}.source")
    if source.type in ("base64", "url"):
        field = "data" if source.type == "base64" else "url"
        raise InvalidRequest(f"Missing required parameter: '{param}.source.{field}'.", param=f"{param}.source.{field}")
    raise InvalidRequest(f"Invalid value for '{param}.source.type': {source.type[:40]!r}; this server takes base64 "
                         "and url sources (it keeps no files).", param=f"{param}.source.type")


def _engine_message(message: InputMessage, param: str) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: tool results become "tool" messages, in order."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    if message.role == "assistant":
        return [_assistant(message.content, f"{param}.content")]
    out: list[dict[str, Any]] = []
    items: list[str | ImageRef] = []
    for i, block in enumerate(message.content):
        where = f"{param}.content[{i}]"
        if block.type == "tool_result" and message.role == "user":
            out.append(_tool_result(block, where))
        elif message.role == "user":
            items.append(_text_or_image(block, where))
        else:
            items.append(_text_of(block, where))
    if items or not out:
        out.append({"role": message.role, "content": message_content(items)})
    return out


def _assistant(blocks: list[ContentBlock], param: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        where = f"{param}[{i}]"
        if block.type == "text":
            texts.append(_text_of(block, where))
        elif block.type == "tool_use":
            if block.id is UNSET or block.name is UNSET:
                raise InvalidRequest(f"Invalid value for '{where}': a tool_use block needs an id and a name.",
                                     param=where)
            args = {} if block.input is UNSET else block.input
            check_depth(args, f"{where}.input")
            calls.append({"id": block.id, "type": "function", "function": {"name": block.name, "arguments": args}})
        elif block.type not in ("thinking", "redacted_thinking"):
            # earlier thinking is dropped, as the chat endpoint drops reasoning sent back
            _refuse(block, where, "an assistant message takes text, tool_use and thinking blocks")
    out: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        out["tool_calls"] = calls
    return out


def _tool_result(block: ContentBlock, param: str) -> dict[str, Any]:
    if block.tool_use_id is UNSET:
        raise InvalidRequest(f"Missing required parameter: '{param}.tool_use_id'.", param=f"{param}.tool_use_id")
    content: Any = block.content if block.content is not UNSET else ""
    if not isinstance(content, str):
        content = message_content([_text_or_image(b, f"{param}.content[{i}]") for i, b in enumerate(content)])
    if block.is_error:
        content = f"Error: {content}" if isinstance(content, str) else [{"type": "text", "text": "Error:"}, *content]
    return {"role": "tool", "tool_call_id": block.tool_use_id, "content": content}


def engine_tools(tools: list[Tool]) -> list[dict[str, Any]]:
    """Client tools as OpenAI function tools; server tools the model cannot run are left out."""
    out = []
    for i, tool in enumerate(tools):
        if tool.input_schema is UNSET:
            continue
        check_depth(tool.input_schema, f"tools[{i}].input_schema")
        function: dict[str, Any] = {"name": tool.name}
        if tool.description is not UNSET:
            function["description"] = tool.description
        function["parameters"] = tool.input_schema
        out.append({"type": "function", "function": function})
    return out


def engine_tool_choice(choice: ToolChoice | None, tools: list[dict[str, Any]]) -> str | dict[str, Any] | None:
    """auto/none as they are, any as required, tool as a named function that must be among the tools."""
    if choice is None:
        return None
    if choice.type in ("any", "tool") and not tools:
        raise InvalidRequest(f"Invalid value for 'tool_choice.type': {choice.type!r} needs tools.",
                             param="tool_choice.type")
    if choice.type == "any":
        return "required"
    if choice.type != "tool":
        return choice.type
    if choice.name is UNSET:
        raise InvalidRequest("Missing required parameter: 'tool_choice.name' (type 'tool' names the tool to call).",
                             param="tool_choice.name")
    names = [t["function"]["name"] for t in tools]
    if choice.name not in names:
        raise InvalidRequest(f"Invalid value for 'tool_choice.name': tool {choice.name!r} is not among the tools "
                             f"({', '.join(names)}).", param="tool_choice.name")
    return {"type": "function", "function": {"name": choice.name}}
