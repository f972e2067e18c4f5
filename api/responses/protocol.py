"""OpenAI Responses request and response bodies as msgspec Structs (OpenAI's names and field order).

Request structs tolerate unknown fields: clients send newer ones (Codex sends client_metadata). Input
items, content parts and tools are loose Structs that api/responses/serving.py checks, so a refused
one (an image, a reference to a stored item) is named with its place in the request.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

from api.bodies import ParamError
from api.request_fields import MaxTokens, Seed, Temperature, TopLogprobs, TopP

ToolName = Annotated[str, Meta(min_length=1, max_length=128)]


# ---------------------------------------------------------------- requests


class InputContent(Struct, kw_only=True):
    """One part of a message's content (input_text, output_text, refusal, input_image, ...)."""

    type: str
    text: str | UnsetType = UNSET
    refusal: str | UnsetType = UNSET
    # input_image: a data URL (or an http(s) URL where IMAGE_URL_FETCH allows); file_id is refused (no file store)
    image_url: str | None | UnsetType = UNSET
    file_id: str | None | UnsetType = UNSET
    detail: Literal["auto", "low", "high", "original"] | None | UnsetType = UNSET


class InputItem(Struct, kw_only=True):
    """One item of `input`: a message (`type: "message"` or a bare {role, content}), a function call, a
    function call's output, reasoning sent back, or another type serving.py names when it refuses it."""

    type: str | UnsetType = UNSET
    id: str | None | UnsetType = UNSET
    # message
    role: Literal["user", "assistant", "system", "developer"] | UnsetType = UNSET
    content: str | list[InputContent] | None | UnsetType = UNSET
    # function_call
    call_id: str | UnsetType = UNSET
    name: str | UnsetType = UNSET
    namespace: str | None | UnsetType = UNSET
    # a JSON object as text (OpenAI's shape); some clients send the object itself
    arguments: str | dict[str, Any] | UnsetType = UNSET
    # function_call_output: a string or input_text parts; other item types give it other shapes
    output: Any = UNSET


class ResponseTool(Struct, kw_only=True):
    """A function tool, a namespace of function tools, or a hosted tool (web_search, ...) the model cannot
    run here, which is left out of the prompt."""

    type: str
    name: ToolName | UnsetType = UNSET
    description: str | None | UnsetType = UNSET
    parameters: dict[str, Any] | None | UnsetType = UNSET
    strict: bool | None | UnsetType = UNSET
    # namespace: its function tools
    tools: list[ResponseTool] | UnsetType = UNSET


class ToolChoiceObject(Struct, kw_only=True):
    """{"type": "function", "name"}, {"type": "allowed_tools", "mode", "tools"}, or a hosted tool's type."""

    type: str
    name: str | UnsetType = UNSET
    # allowed_tools
    mode: Literal["auto", "required"] | UnsetType = UNSET
    tools: list[dict[str, Any]] | UnsetType = UNSET


ToolChoice = Literal["none", "auto", "required"] | ToolChoiceObject


class TextFormat(Struct, kw_only=True):
    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Meta(min_length=1, max_length=64)] | UnsetType = UNSET
    description: str | None | UnsetType = UNSET
    schema: dict[str, Any] | UnsetType = UNSET
    strict: bool | None | UnsetType = UNSET

    def __post_init__(self) -> None:
        if self.type == "json_schema":
            if self.name is UNSET:
                raise ParamError("a json_schema format needs a name", "name")
            if self.schema is UNSET:
                raise ParamError("a json_schema format needs a schema", "schema")


class TextConfig(Struct, kw_only=True):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(Struct, kw_only=True):
    # any level is accepted (new ones keep coming); serving.py reads "none" as thinking off and passes the known levels
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class ResponseStreamOptions(Struct, kw_only=True):
    include_obfuscation: bool | None = None


class ResponsesRequest(Struct, kw_only=True):
    model: str
    input: str | list[InputItem]
    background: bool | None = None
    conversation: Any = UNSET
    include: list[str] | None = None
    instructions: str | None = None
    max_output_tokens: MaxTokens | None = None
    max_tool_calls: Annotated[int, Meta(ge=0)] | None = None
    metadata: dict[str, str] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    prompt: Any = UNSET
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    reasoning: ReasoningConfig | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    store: bool | None = None
    stream: bool | None = None
    stream_options: ResponseStreamOptions | None = None
    temperature: Temperature | None = None
    text: TextConfig | None = None
    tool_choice: ToolChoice | None = None
    tools: Annotated[list[ResponseTool], Meta(max_length=128)] | None = None
    top_logprobs: TopLogprobs | None = None
    top_p: TopP | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
    # non-OpenAI extensions
    seed: Seed | None = None

    def __post_init__(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise ParamError("stream_options is only allowed when stream is true", "stream_options")


# ---------------------------------------------------------------- responses


class TopLogProb(Struct, kw_only=True):
    token: str
    bytes: list[int]
    logprob: float


class LogProb(Struct, kw_only=True):
    token: str
    bytes: list[int]
    logprob: float
    top_logprobs: list[TopLogProb]


class OutputText(Struct, tag="output_text", tag_field="type", kw_only=True):
    text: str
    annotations: list[dict[str, Any]] = []
    logprobs: list[LogProb] = []


class ReasoningText(Struct, tag="reasoning_text", tag_field="type", kw_only=True):
    text: str


class SummaryText(Struct, tag="summary_text", tag_field="type", kw_only=True):
    text: str


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class ReasoningItem(Struct, tag="reasoning", tag_field="type", kw_only=True):
    """The model's thinking: its text as `content` (reasoning_text); this server writes no summaries and
    encrypts nothing."""

    id: str
    summary: list[SummaryText] = []
    content: list[ReasoningText] = []
    encrypted_content: str | None = None
    status: ItemStatus = "completed"


class MessageItem(Struct, tag="message", tag_field="type", kw_only=True):
    id: str
    role: Literal["assistant"] = "assistant"
    status: ItemStatus = "completed"
    content: list[OutputText] = []


class FunctionCallItem(Struct, tag="function_call", tag_field="type", kw_only=True):
    id: str
    call_id: str
    name: str
    # the namespace tool the function came from, when it did (Codex routes calls by namespace and name)
    namespace: str | UnsetType = UNSET
    arguments: str
    status: ItemStatus = "completed"


OutputItem = ReasoningItem | MessageItem | FunctionCallItem


class InputTokensDetails(Struct, kw_only=True):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(Struct, kw_only=True):
    reasoning_tokens: int = 0


class ResponseUsage(Struct, kw_only=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(Struct, kw_only=True):
    reason: Literal["max_output_tokens"]


class ResponseError(Struct, kw_only=True):
    code: str
    message: str
    param: str | None = None
    type: str | None = None


class ReasoningEcho(Struct, kw_only=True):
    effort: str | None = None
    summary: str | None = None


ResponseStatus = Literal["in_progress", "completed", "incomplete", "failed"]


class Response(Struct, kw_only=True):
    """The response object: the body of a non-streamed answer, and of every lifecycle stream event."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ResponseStatus
    background: bool = False
    completed_at: int | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    prompt_cache_key: str | None = None
    reasoning: ReasoningEcho
    safety_identifier: str | None = None
    service_tier: str = "default"
    # nothing is kept, whatever the request's store said
    store: bool = False
    temperature: float = 1.0
    text: TextConfig
    tool_choice: ToolChoice
    tools: list[ResponseTool]
    top_logprobs: int = 0
    top_p: float = 1.0
    truncation: Literal["auto", "disabled"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str]
