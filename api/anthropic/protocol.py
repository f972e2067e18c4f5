"""Anthropic Messages request and response bodies as msgspec Structs (Anthropic's names and field order).

Request structs tolerate unknown fields: Claude Code sends beta features (context_management,
cache_control, ...) that change nothing here. Content blocks are one loose Struct
checked in api/anthropic/serving.py, so a refused block (a document) is named with its place.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

from api.request_fields import MaxTokens, Seed, TopK, TopP

# Anthropic's temperature goes to 1, where OpenAI's goes to 2
Temperature = Annotated[float, Meta(ge=0, le=1)]
StopSequence = Annotated[str, Meta(min_length=1)]


# ---------------------------------------------------------------- requests


class ImageSource(Struct, kw_only=True):
    """An image block's source: base64 (data, media_type), url, or file (refused: no file store); checked in
    serving.py."""

    type: str
    media_type: str | UnsetType = UNSET
    data: str | UnsetType = UNSET
    url: str | UnsetType = UNSET
    file_id: str | UnsetType = UNSET


class ContentBlock(Struct, kw_only=True):
    """Any content block (text, tool_use, tool_result, thinking, image, ...); serving.py checks its fields."""

    type: str
    text: str | UnsetType = UNSET
    # tool_use
    id: str | UnsetType = UNSET
    name: str | UnsetType = UNSET
    input: dict[str, Any] | UnsetType = UNSET
    # tool_result: a string or text blocks
    tool_use_id: str | UnsetType = UNSET
    content: str | list[ContentBlock] | UnsetType = UNSET
    is_error: bool = False
    # thinking
    thinking: str | UnsetType = UNSET
    # image
    source: ImageSource | UnsetType = UNSET


class InputMessage(Struct, kw_only=True):
    # "system" is not Anthropic's, but Claude Code sends it mid-conversation; it is kept in place
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class Tool(Struct, kw_only=True):
    """A client tool (input_schema); server tools (web_search_..., no input_schema) are left out."""

    name: Annotated[str, Meta(min_length=1)]
    description: str | UnsetType = UNSET
    input_schema: dict[str, Any] | UnsetType = UNSET
    type: str | UnsetType = UNSET


class ToolChoice(Struct, kw_only=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | UnsetType = UNSET
    disable_parallel_tool_use: bool = False


class ThinkingConfig(Struct, kw_only=True):
    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: int | UnsetType = UNSET


class JSONOutputFormat(Struct, kw_only=True):
    """Structured outputs: the answer's text is one JSON value matching schema."""

    type: Literal["json_schema"]
    schema: dict[str, Any]


class OutputConfig(Struct, kw_only=True):
    effort: str | None = None
    format: JSONOutputFormat | None = None


class CountTokensRequest(Struct, kw_only=True):
    model: str
    messages: list[InputMessage]
    system: str | list[ContentBlock] | UnsetType = UNSET
    tools: list[Tool] | UnsetType = UNSET
    tool_choice: ToolChoice | UnsetType = UNSET
    thinking: ThinkingConfig | UnsetType = UNSET
    output_config: OutputConfig | None | UnsetType = UNSET
    # the structured-outputs beta's spelling of output_config.format, which the API still accepts
    output_format: JSONOutputFormat | None | UnsetType = UNSET


class MessagesRequest(CountTokensRequest, kw_only=True):
    max_tokens: MaxTokens
    stop_sequences: list[StopSequence] | UnsetType = UNSET
    stream: bool = False
    temperature: Temperature | UnsetType = UNSET
    top_p: TopP | UnsetType = UNSET
    top_k: TopK | UnsetType = UNSET
    metadata: dict[str, Any] | UnsetType = UNSET
    # non-Anthropic extensions
    seed: Seed | None = None


# ---------------------------------------------------------------- responses


class TextBlock(Struct, tag="text", tag_field="type"):
    text: str


class ThinkingBlock(Struct, tag="thinking", tag_field="type"):
    thinking: str
    signature: str = ""  # nothing to sign here; the SDK expects the field


class ToolUseBlock(Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: dict[str, Any]


OutputBlock = TextBlock | ThinkingBlock | ToolUseBlock
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class Usage(Struct, kw_only=True):
    """Anthropic counts the prompt in parts: input_tokens were computed, cache_read_input_tokens came from the
    engine's prefix cache (their sum is the prompt)."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0


class Message(Struct, kw_only=True):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[OutputBlock]
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: Usage


class TokenCount(Struct, kw_only=True):
    input_tokens: int
